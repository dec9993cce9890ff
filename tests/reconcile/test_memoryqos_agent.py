"""CgroupReconcile (memory QoS) in the running agent: cluster and local mode, synthetic v1 and v2 nodes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from koordqos.cgroups.executor import CGROUP_WRITES
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.kube.sources import NODESLO_INVALID_FIELDS
from koordqos.model.pod import parse_pod
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.strategies.memoryqos import ABSENT_FILES, MEMORY_QOS_RESOURCES
from koordqos.testing.nodefs import GiB, SyntheticNode
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo, make_pod

from .conftest import NODE, VERSIONS, cluster_agent, local_agent, more_rounds, wait_for

GATES = {"CgroupReconcile": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False}
ANOLIS = [r for r in MEMORY_QOS_RESOURCES]
MAX_V1 = "9223372036854775807"
LS_QOS = {
    "enable": True,
    "minLimitPercent": 50,
    "lowLimitPercent": 60,
    "throttlingPercent": 80,
    "wmarkRatio": 95,
    "wmarkScalePermill": 20,
    "wmarkMinAdj": -25,
    "priorityEnable": 1,
    "priority": 6,
    "oomKillGroup": 1,
}
SPEC: dict[str, Any] = {"resourceQOSStrategy": {"lsClass": {"memoryQOS": LS_QOS}}}


def mem(node: SyntheticNode, rel: str, name: str) -> str:
    return node.read(rel, "memory", name)


def high_max(node: SyntheticNode) -> str:
    return MAX_V1 if node.version is CgroupVersion.V1 else "max"


def ls_pod() -> dict[str, Any]:
    raw = make_pod(
        "ls",
        NODE,
        qos="LS",
        uid="uid-ls",
        requests={"memory": "1Gi"},
        limits={"memory": "2Gi"},
    )
    raw["status"]["qosClass"] = "Burstable"
    return raw


@pytest.mark.parametrize("layout", VERSIONS)
async def test_cluster_mode_writes_disables_and_rejects(
    tmp_path: Path, server: FakeAPIServer, layout: tuple[CgroupVersion, CgroupDriver]
) -> None:
    version, driver = layout
    node = SyntheticNode(tmp_path / "node", version, driver, memory_total=8 * GiB, extensions=ANOLIS)
    raw = ls_pod()
    pod = parse_pod(raw)
    pod_dir = node.add_pod(pod)
    ctr_dir = node.layout.container_dir(pod, pod.containers[0].container_id)
    burstable = node.layout.qos_dir(pod.kube_qos)
    server.upsert("nodes", make_node(NODE, cpu="8", memory="8Gi"))
    server.upsert("pods", raw)
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    async with cluster_agent(tmp_path, server, node, GATES) as agent:
        await wait_for(lambda: mem(node, ctr_dir, "memory.high") != high_max(node), what="memory.high")
        await more_rounds(agent, "CgroupReconcile", 1)  # the round that wrote it has finished
        half = str(GiB // 2)
        assert mem(node, pod_dir, "memory.min") == half
        assert mem(node, pod_dir, "memory.low") == str(GiB * 60 // 100)
        assert mem(node, ctr_dir, "memory.min") == half
        # 1Gi + (2Gi − 1Gi) × 80 % = 1.8 Gi, page aligned
        assert mem(node, ctr_dir, "memory.high") == str((GiB + GiB * 80 // 100) // 4096 * 4096)
        assert mem(node, burstable, "memory.min") == half
        assert mem(node, node.layout.kubepods_dir(), "memory.min") == half
        for rel in (pod_dir, ctr_dir):
            assert mem(node, rel, "memory.wmark_ratio") == "95"
            assert mem(node, rel, "memory.wmark_scale_factor") == "20"
            assert mem(node, rel, "memory.wmark_min_adj") == "-25"
        for rel in (burstable, pod_dir, ctr_dir):
            assert mem(node, rel, "memory.priority") == "6"
            assert mem(node, rel, "memory.use_priority_oom") == "1"
            assert mem(node, rel, "memory.oom.group") == "1"
        assert mem(node, burstable, "memory.wmark_ratio") == "0"  # no wmark knobs at QoS level

        # steady state: nothing more is written
        strategy = agent.parts.qos_manager.runners["CgroupReconcile"].strategy
        executor = agent.services.executor
        await more_rounds(agent, "CgroupReconcile")
        writes = executor.file_writes
        await more_rounds(agent, "CgroupReconcile", 3)
        assert executor.file_writes == writes
        assert strategy.last_writes == 0

        # an invalid value: rejected with a counted error, that file unchanged, the others still applied (the
        # NodeSLO validator keeps the field's last valid value: the strategy never sees 101)
        invalid = NODESLO_INVALID_FIELDS.labels("api")._value.get()
        bad = copy.deepcopy(SPEC)
        bad["resourceQOSStrategy"]["lsClass"]["memoryQOS"].update({"wmarkRatio": 101, "priority": 7})
        server.upsert("nodeslos", make_nodeslo(NODE, bad))
        await wait_for(lambda: mem(node, pod_dir, "memory.priority") == "7", what="priority 7")
        await more_rounds(agent, "CgroupReconcile", 1)
        assert mem(node, pod_dir, "memory.wmark_ratio") == "95"
        assert NODESLO_INVALID_FIELDS.labels("api")._value.get() == invalid + 1

        # disabling the class restores the None template
        off = copy.deepcopy(SPEC)
        off["resourceQOSStrategy"]["lsClass"]["memoryQOS"]["enable"] = False
        server.upsert("nodeslos", make_nodeslo(NODE, off))
        await wait_for(lambda: mem(node, ctr_dir, "memory.high") == high_max(node), what="memory.high max")
        await more_rounds(agent, "CgroupReconcile", 1)
        for rel in (pod_dir, ctr_dir):
            assert mem(node, rel, "memory.min") == "0"
            assert mem(node, rel, "memory.wmark_ratio") == "0"
            assert mem(node, rel, "memory.wmark_scale_factor") == "50"
            assert mem(node, rel, "memory.priority") == "0"
        assert mem(node, burstable, "memory.min") == "0"


@pytest.mark.parametrize("layout", VERSIONS)
async def test_mainline_kernel_absent_files_are_skipped_without_errors(
    tmp_path: Path, server: FakeAPIServer, layout: tuple[CgroupVersion, CgroupDriver]
) -> None:
    """Mainline v2 has memory.min/low/high only; mainline v1 has none of them: never a write error."""
    version, driver = layout
    node = SyntheticNode(tmp_path / "node", version, driver, memory_total=8 * GiB)
    raw = ls_pod()
    pod = parse_pod(raw)
    pod_dir = node.add_pod(pod)
    server.upsert("nodes", make_node(NODE, cpu="8", memory="8Gi"))
    server.upsert("pods", raw)
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    failed = {
        o: CGROUP_WRITES.labels("memory.wmark_ratio", o)._value.get() for o in ("failed", "unsupported")
    }
    async with cluster_agent(tmp_path, server, node, GATES) as agent:
        await more_rounds(agent, "CgroupReconcile", 3)
        strategy = agent.parts.qos_manager.runners["CgroupReconcile"].strategy
        if version is CgroupVersion.V2:
            assert strategy.supported == {"memory.min", "memory.low", "memory.high"}
            assert mem(node, pod_dir, "memory.min") == str(GiB // 2)
        else:
            assert strategy.supported == frozenset()
        assert ABSENT_FILES.labels("CgroupReconcile", "memory.wmark_ratio")._value.get() == 1
        for o, before in failed.items():
            assert CGROUP_WRITES.labels("memory.wmark_ratio", o)._value.get() == before  # never even tried


async def test_dry_run_writes_nothing_and_records_decisions(tmp_path: Path, server: FakeAPIServer) -> None:
    node = SyntheticNode(tmp_path / "node", extensions=ANOLIS)
    raw = ls_pod()
    pod = parse_pod(raw)
    pod_dir = node.add_pod(pod)
    server.upsert("nodes", make_node(NODE, cpu="8", memory="8Gi"))
    server.upsert("pods", raw)
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    async with cluster_agent(tmp_path, server, node, GATES, dry_run=True) as agent:
        await wait_for(
            lambda: any(
                d.target == f"{pod_dir}/memory.min"
                for d in agent.decisions.recent(strategy="CgroupReconcile")
            ),
            what="a dry-run decision for memory.min",
        )
        decisions = agent.decisions.recent(strategy="CgroupReconcile")
        assert all(d.dry_run for d in decisions)
        assert mem(node, pod_dir, "memory.min") == "0"
        assert mem(node, pod_dir, "memory.wmark_ratio") == "0"
        assert agent.services.executor.file_writes == 0


@pytest.mark.parametrize("layout", VERSIONS)
async def test_local_mode_nri_pod_and_nodeslo_file(
    short_dir: Path, layout: tuple[CgroupVersion, CgroupDriver]
) -> None:
    version, driver = layout
    node = SyntheticNode(short_dir / "node", version, driver, memory_total=8 * GiB, extensions=ANOLIS)
    uid = "6f7a8b9c-1c2d-4e3f-9a0b-1c2d3e4f5a6b"
    sandbox = api.PodSandbox(
        id="sbx" + "1" * 13,
        name="web",
        uid=uid,
        namespace="default",
        labels={"koordinator.sh/qosClass": "LS", "io.kubernetes.pod.uid": uid},
    )
    cid = "cccc000000000003"
    if driver is CgroupDriver.SYSTEMD:
        sandbox.linux.cgroup_parent = f"kubepods-pod{uid.replace('-', '_')}.slice"
        path = f"{sandbox.linux.cgroup_parent}:cri-containerd:{cid}"
    else:
        sandbox.linux.cgroup_parent = f"/kubepods/pod{uid}"
        path = f"{sandbox.linux.cgroup_parent}/{cid}"
    ctr = api.Container(id=cid, pod_sandbox_id=sandbox.id, name="main", state=api.CONTAINER_CREATED)
    ctr.linux.resources.memory.limit.value = GiB
    ctr.linux.cgroups_path = path
    lay = node.layout
    pod_dir = lay.normalize_parent(sandbox.linux.cgroup_parent)
    ctr_dir = lay.normalize_parent(path)
    node.make_cgroup(pod_dir)
    node.make_cgroup(ctr_dir)
    spec = {"resourceQOSStrategy": {"lsClass": {"memoryQOS": {**LS_QOS, "throttlingPercent": 50}}}}
    async with local_agent(short_dir, node, {"spec": spec}, GATES) as (agent, runtime, slo_file):
        await runtime.run_pod_sandbox(sandbox)
        await runtime.create_container(sandbox, ctr)
        ctr.state = api.CONTAINER_RUNNING
        await runtime.start_container(sandbox, ctr)
        # Guaranteed (request = limit = 1Gi): min 50 %, high = request (no room above it)
        await wait_for(lambda: mem(node, ctr_dir, "memory.min") == str(GiB // 2), what="container memory.min")
        await more_rounds(agent, "CgroupReconcile", 1)
        assert mem(node, pod_dir, "memory.min") == str(GiB // 2)
        assert mem(node, ctr_dir, "memory.high") == str(GiB)
        assert mem(node, ctr_dir, "memory.wmark_ratio") == "95"
        assert mem(node, lay.kubepods_dir(), "memory.min") == str(GiB // 2)
        # the file changes: the class is disabled, the None template comes back
        spec["resourceQOSStrategy"]["lsClass"]["memoryQOS"]["enable"] = False
        slo_file.write_text(json.dumps({"spec": spec}))
        await wait_for(lambda: mem(node, ctr_dir, "memory.min") == "0", what="memory.min back to 0")
        await more_rounds(agent, "CgroupReconcile", 1)
        assert mem(node, ctr_dir, "memory.wmark_ratio") == "0"
        assert mem(node, ctr_dir, "memory.high") == high_max(node)
        assert agent.parts.qos_manager.runners["CgroupReconcile"].failures == 0
