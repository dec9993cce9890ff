"""ResctrlReconcile and the Resctrl pod groups in the running agent, on a synthetic resctrl tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.model.pod import parse_pod
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.testing.nodefs import SyntheticNode
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo, make_pod

from .conftest import INTERVAL, NODE, VERSIONS, cluster_agent, local_agent, more_rounds, wait_for

GATES = {"RdtResctrl": True, "Resctrl": True, "BECPUSuppress": False, "CPUBurst": False}
SPEC: dict[str, Any] = {
    "resourceQOSStrategy": {
        "lsClass": {"resctrlQOS": {"enable": True, "catRangeStartPercent": 10, "catRangeEndPercent": 50}},
        "beClass": {
            "resctrlQOS": {
                "enable": True,
                "catRangeStartPercent": 0,
                "catRangeEndPercent": 30,
                "mbaPercent": 85,
            }
        },
    }
}


def group_file(node: SyntheticNode, group: str, name: str) -> str:
    return (node.resctrl_root / group / name).read_text()


def tasks(node: SyntheticNode, group: str) -> list[int]:
    path = node.resctrl_root / group / "tasks"
    return [int(t) for t in path.read_text().split()] if path.exists() else []


def prepare_groups(node: SyntheticNode, groups: list[str]) -> None:
    """A synthetic tree has no kernel to make a group's files: create them when the agent makes the dir."""
    for g in groups:
        d = node.resctrl_root / g
        if d.is_dir():
            for f in ("schemata", "tasks"):
                if not (d / f).exists():
                    (d / f).write_text("")


@pytest.mark.parametrize("layout", VERSIONS)
async def test_class_groups_schemata_tasks_and_pod_group(
    tmp_path: Path, server: FakeAPIServer, layout: tuple[CgroupVersion, CgroupDriver]
) -> None:
    version, driver = layout
    node = SyntheticNode(tmp_path / "node", version, driver)
    node.add_resctrl(cbm="7ff", cache_ids=(0, 1))
    for g in ("LSR", "LS", "BE"):  # as the kernel would show them once created
        (node.resctrl_root / g).mkdir()
        (node.resctrl_root / g / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
        (node.resctrl_root / g / "tasks").write_text("")
    be_raw = make_pod("be", NODE, qos="BE", uid="uid-be")
    ls_raw = make_pod("ls", NODE, qos="LS", uid="uid-ls")
    ann = {"node.koordinator.sh/resctrl": json.dumps({"llc": {"schemata": {"range": [0, 50]}}})}
    own_raw = make_pod("own", NODE, qos="LS", uid="uid-own", annotations=ann)
    dirs = {}
    for raw, tids in ((be_raw, [122450, 122454]), (ls_raw, [4321, 4322]), (own_raw, [777])):
        pod = parse_pod(raw)
        node.add_pod(pod)
        cdir = node.layout.container_dir(pod, pod.containers[0].container_id)
        node.set_threads(cdir, tids)
        dirs[pod.uid] = cdir
        server.upsert("pods", raw)
    (node.resctrl_root / "koordlet-gone").mkdir()  # a pod group whose pod is gone
    (node.resctrl_root / "koordlet-gone" / "tasks").write_text("")
    server.upsert("nodes", make_node(NODE))
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    qos = {"reconcile_interval_seconds": INTERVAL, "resctrl_task_sweep_seconds": 0.2}
    async with cluster_agent(tmp_path, server, node, GATES, qos=qos) as agent:
        await wait_for((node.resctrl_root / "koordlet-uid-own").is_dir, what="the pod group")
        prepare_groups(node, ["koordlet-uid-own"])
        await wait_for(lambda: tasks(node, "koordlet-uid-own") == [777], what="the pod's thread in its group")
        await more_rounds(agent, "RdtResctrl", 1)
        assert group_file(node, "LS", "schemata") == "L3:0=3c;1=3c;\nMB:0=100;1=100;\n"
        # 0-30 % of 11 ways = 4 ways; MBA 85 % → 90 (Intel: next multiple of 10)
        assert group_file(node, "BE", "schemata") == "L3:0=f;1=f;\nMB:0=90;1=90;\n"
        # LSR is disabled: its None template (0-100 %, MBA 100) is what the group already has, so unchanged
        assert group_file(node, "LSR", "schemata") == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"
        assert group_file(node, "koordlet-uid-own", "schemata") == "L3:0=3f;1=3f;\n"
        assert tasks(node, "BE") == [122450, 122454]
        assert tasks(node, "LS") == [4321, 4322]  # the annotated LS pod's thread is not in the class group
        assert not (node.resctrl_root / "koordlet-gone").exists()

        # a thread started from outside the group (exec) is found by the sweep and appended once; the
        # existing ones are not rewritten (--resctrl-task-sweep-seconds=0.2 for the test)
        node.set_threads(dirs["uid-be"], [122450, 122454, 123111])
        await wait_for(lambda: tasks(node, "BE") == [122450, 122454, 123111], what="the new BE thread")
        await more_rounds(agent, "RdtResctrl", 2)
        assert tasks(node, "BE") == [122450, 122454, 123111]

        # the annotation goes: the pod group is removed
        own = make_pod("own", NODE, qos="LS", uid="uid-own")
        server.upsert("pods", own)
        await wait_for(
            lambda: not (node.resctrl_root / "koordlet-uid-own").exists(), what="pod group removed"
        )


async def test_no_resctrl_mounted_is_one_warning_and_idle(tmp_path: Path, server: FakeAPIServer) -> None:
    node = SyntheticNode(tmp_path / "node")
    server.upsert("nodes", make_node(NODE))
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    async with cluster_agent(tmp_path, server, node, GATES) as agent:
        await more_rounds(agent, "RdtResctrl", 3)
        runner = agent.parts.qos_manager.runners["RdtResctrl"]
        assert runner.failures == 0
        assert agent.services.host.batches == 0
        assert not (node.sys_root / "fs").exists()


async def test_dry_run_creates_nothing(tmp_path: Path, server: FakeAPIServer) -> None:
    node = SyntheticNode(tmp_path / "node")
    node.add_resctrl(cbm="7ff", cache_ids=(0, 1), vendor="AuthenticAMD")
    server.upsert("nodes", make_node(NODE))
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    async with cluster_agent(tmp_path, server, node, GATES, dry_run=True) as agent:
        await wait_for(
            lambda: any(d.target == "resctrl/BE/schemata" for d in agent.decisions.recent()),
            what="the dry-run schemata decision",
        )
        d = next(d for d in agent.decisions.recent() if d.target == "resctrl/BE/schemata")
        assert d.dry_run
        assert d.new == "L3:0=f;1=f;\nMB:0=136;1=136;"  # AMD: 160 × 85 % = 136
        assert not (node.resctrl_root / "BE").exists()


async def test_local_mode_nri_pod_threads(short_dir: Path) -> None:
    node = SyntheticNode(short_dir / "node")
    node.add_resctrl(cbm="ff", cache_ids=(0,))
    uid = "7a8b9c0d-1c2d-4e3f-9a0b-1c2d3e4f5a6b"
    sandbox = api.PodSandbox(
        id="sbx" + "2" * 13,
        name="batch",
        uid=uid,
        namespace="default",
        labels={"koordinator.sh/qosClass": "BE", "io.kubernetes.pod.uid": uid},
    )
    sandbox.linux.cgroup_parent = f"/kubepods/besteffort/pod{uid}"
    cid = "dddd000000000004"
    ctr = api.Container(id=cid, pod_sandbox_id=sandbox.id, name="main", state=api.CONTAINER_CREATED)
    ctr.linux.cgroups_path = f"{sandbox.linux.cgroup_parent}/{cid}"
    lay = node.layout
    node.make_cgroup(lay.normalize_parent(sandbox.linux.cgroup_parent))
    cdir = lay.normalize_parent(ctr.linux.cgroups_path)
    node.make_cgroup(cdir)
    node.set_threads(cdir, [9001, 9002])
    async with local_agent(short_dir, node, {"spec": SPEC}, GATES) as (_agent, runtime, _file):
        await wait_for((node.resctrl_root / "BE").is_dir, what="the BE group")
        prepare_groups(node, ["LSR", "LS", "BE"])
        await runtime.run_pod_sandbox(sandbox)
        await runtime.create_container(sandbox, ctr)
        ctr.state = api.CONTAINER_RUNNING
        await runtime.start_container(sandbox, ctr)
        await wait_for(lambda: tasks(node, "BE") == [9001, 9002], what="the NRI pod's threads in BE")
        await wait_for(lambda: group_file(node, "BE", "schemata").startswith("L3:0=7;"), what="BE schemata")
