"""SystemConfigReconcile in the running agent, on a synthetic proc/sys root only (never this machine's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from koordqos.strategies.framework import INVALID_CONFIG
from koordqos.testing.nodefs import SyntheticNode
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo

from .conftest import NODE, cluster_agent, local_agent, more_rounds, wait_for

GATES = {"SystemConfig": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False}
OPTIONAL = {
    "memcg_reaper": "0",
    "group_identity": "1",
    "idle_saver": "0",
    "pagecache_limit": "0",
    "sched_features": "GENTLE_FAIR_SLEEPERS NO_ID_ABSOLUTE_EXPEL ID_EXPELLER_SHARE_CORE",
}


def proc(node: SyntheticNode, rel: str) -> str:
    return (node.proc_root / "sys" / rel).read_text().strip()


def sys_(node: SyntheticNode, rel: str) -> str:
    return (node.sys_root / rel).read_text().strip()


def spec(**system: Any) -> dict[str, Any]:
    return {"systemStrategy": system}


async def test_cluster_mode_spec_values_out_of_range_and_restore(
    tmp_path: Path, server: FakeAPIServer
) -> None:
    node = SyntheticNode(tmp_path / "node")
    node.add_sysctls(**OPTIONAL)
    server.upsert("nodes", make_node(NODE, memory="512Gi"))
    server.upsert(
        "nodeslos",
        make_nodeslo(NODE, spec(minFreeKbytesFactor=88, watermarkScaleFactor=99, memcgReapBackGround=1)),
    )
    async with cluster_agent(tmp_path, server, node, GATES) as agent:
        await wait_for(lambda: proc(node, "vm/min_free_kbytes") == "4724464", what="min_free_kbytes 4724464")
        await more_rounds(agent, "SystemConfig", 1)
        assert proc(node, "vm/watermark_scale_factor") == "99"
        assert sys_(node, "kernel/mm/memcg_reaper/reap_background") == "1"
        host = agent.services.host
        batches = host.batches
        await more_rounds(agent, "SystemConfig", 3)
        assert host.batches == batches  # steady state: nothing applied, nothing even read

        # out of range: rejected (counted), files unchanged
        before = INVALID_CONFIG.labels("SystemConfig")._value.get()
        server.upsert(
            "nodeslos",
            make_nodeslo(
                NODE, spec(minFreeKbytesFactor=400, watermarkScaleFactor=500, memcgReapBackGround=2)
            ),
        )
        await wait_for(
            lambda: INVALID_CONFIG.labels("SystemConfig")._value.get() >= before + 3,
            what="3 rejections",
        )
        await more_rounds(agent, "SystemConfig", 1)
        assert proc(node, "vm/min_free_kbytes") == "4724464"
        assert proc(node, "vm/watermark_scale_factor") == "99"
        assert sys_(node, "kernel/mm/memcg_reaper/reap_background") == "1"

        # the optional knobs and sched features
        server.upsert(
            "nodeslos",
            make_nodeslo(
                NODE,
                spec(
                    minFreeKbytesFactor=88,
                    schedIdleSaverWmark=5000000,
                    schedGroupIdentityEnabled=0,
                    pageCacheLimitEnabled=1,
                    schedFeatures={"ID_ABSOLUTE_EXPEL": True},
                ),
            ),
        )
        await wait_for(
            lambda: proc(node, "kernel/sched_idle_saver_wmark") == "5000000", what="idle saver wmark"
        )
        await more_rounds(agent, "SystemConfig", 1)
        assert proc(node, "kernel/sched_group_identity_enabled") == "0"
        assert sys_(node, "kernel/mm/pagecache_limit/enabled") == "1"
        assert sys_(node, "kernel/debug/sched_features") == "ID_ABSOLUTE_EXPEL"
        # fields removed from the NodeSLO: what was there before koordqos changed it comes back
        assert proc(node, "vm/watermark_scale_factor") == "150"
        assert sys_(node, "kernel/mm/memcg_reaper/reap_background") == "0"

        server.upsert("nodeslos", make_nodeslo(NODE, spec()))
        await wait_for(lambda: proc(node, "vm/min_free_kbytes") == "5368709", what="min_free_kbytes restored")
        await more_rounds(agent, "SystemConfig", 1)
        assert proc(node, "kernel/sched_idle_saver_wmark") == "0"
        assert proc(node, "kernel/sched_group_identity_enabled") == "1"


async def test_dry_run_and_kernel_without_optional_files(tmp_path: Path, server: FakeAPIServer) -> None:
    node = SyntheticNode(tmp_path / "node")
    node.add_sysctls()  # mainline: only the vm sysctls
    server.upsert("nodes", make_node(NODE, memory="512Gi"))
    server.upsert(
        "nodeslos",
        make_nodeslo(NODE, spec(minFreeKbytesFactor=88, memcgReapBackGround=1, schedIdleSaverWmark=7)),
    )
    async with cluster_agent(tmp_path, server, node, GATES, dry_run=True) as agent:
        await wait_for(
            lambda: any(d.target == "sysctl/vm/min_free_kbytes" for d in agent.decisions.recent()),
            what="the dry-run decision",
        )
        d = next(d for d in agent.decisions.recent() if d.target == "sysctl/vm/min_free_kbytes")
        assert (d.dry_run, d.old, d.new) == (True, "5368709", "4724464")
        assert proc(node, "vm/min_free_kbytes") == "5368709"
        strategy = agent.parts.qos_manager.runners["SystemConfig"].strategy
        assert strategy.present == frozenset()
        assert not (node.sys_root / "kernel/mm/memcg_reaper").exists()
        assert agent.parts.qos_manager.runners["SystemConfig"].failures == 0


async def test_local_mode_nodeslo_file(short_dir: Path) -> None:
    node = SyntheticNode(short_dir / "node", memory_total=512 * 1024**3)
    node.add_sysctls(**OPTIONAL)
    slo = {"spec": spec(minFreeKbytesFactor=88, watermarkScaleFactor=99)}
    async with local_agent(short_dir, node, slo, GATES) as (agent, _runtime, slo_file):
        await wait_for(lambda: proc(node, "vm/min_free_kbytes") == "4724464", what="min_free_kbytes")
        await more_rounds(agent, "SystemConfig", 1)  # the round that wrote it has finished
        assert proc(node, "vm/watermark_scale_factor") == "99"
        slo_file.write_text(json.dumps({"spec": spec(minFreeKbytesFactor=88, watermarkScaleFactor=120)}))
        await wait_for(lambda: proc(node, "vm/watermark_scale_factor") == "120", what="the file's new value")
