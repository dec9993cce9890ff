"""BlkioReconcile in the running agent: BE class, root cost files and a pod volume, on v1 and v2 nodes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion, parse_device_lines
from koordqos.model.pod import parse_pod
from koordqos.strategies.blkio import pod_volume_mount
from koordqos.testing.nodefs import SyntheticNode
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo, make_pod

from .conftest import NODE, VERSIONS, cluster_agent, more_rounds, wait_for

GATES = {"BlkIOReconcile": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False}
UID = "uid-web"
IO = {"ioWeightPercent": 40, "readIOPS": 1024, "writeIOPS": 1024, "readBPS": 1048576, "writeBPS": 1048576}
SPEC: dict[str, Any] = {
    "resourceQOSStrategy": {
        "beClass": {
            "blkioQOS": {
                "enable": True,
                "blocks": [{"name": "yoda-pool0", "type": "volumegroup", "ioCfg": IO}],
            }
        },
        "cgroupRoot": {
            "blkioQOS": {
                "enable": True,
                "blocks": [
                    {
                        "name": "/dev/vdb",
                        "type": "device",
                        "ioCfg": {
                            "readLatency": 1000,
                            "writeLatency": 1000,
                            "readLatencyPercent": 90,
                            "writeLatencyPercent": 90,
                        },
                    }
                ],
            }
        },
    }
}


def storage(node: SyntheticNode) -> None:
    """/dev/vda (253:0, root fs), /dev/vdb (253:16) as the PV of VG yoda-pool0 with the pod's volume."""
    node.add_block_device("vda", "253:0", [("vda1", "253:1")])
    node.add_block_device("vdb", "253:16")
    lv = node.add_logical_volume("dm-0", "252:0", "yoda-pool0", "csi-vol", "vdb")
    node.add_mount("/dev/vda1", "/")
    node.add_mount(lv, pod_volume_mount("/var/lib/kubelet", UID, "scratch"))
    node.add_blkio_root()


def lines(node: SyntheticNode, rel: str, name: str) -> dict[str, str]:
    sub = "blkio" if node.version is CgroupVersion.V1 else "io"
    return parse_device_lines(node.read(rel, sub, name))


def be_pod() -> dict[str, Any]:
    ann = {
        "koordinator.sh/blkioQOS": json.dumps(
            {
                "blocks": [
                    {"name": "scratch", "type": "podvolume", "ioCfg": {"readIOPS": 2048, "writeIOPS": 512}}
                ]
            }
        )
    }
    raw = make_pod("web", NODE, qos="BE", uid=UID, annotations=ann)
    raw["status"]["qosClass"] = "BestEffort"
    raw["spec"]["volumes"] = [{"name": "scratch", "csi": {"driver": "local.csi"}}]
    return raw


@pytest.mark.parametrize("layout", VERSIONS)
async def test_be_class_root_and_pod_volume(
    tmp_path: Path, server: FakeAPIServer, layout: tuple[CgroupVersion, CgroupDriver]
) -> None:
    version, driver = layout
    node = SyntheticNode(tmp_path / "node", version, driver, extensions=["blkio.cost.weight"])
    storage(node)
    raw = be_pod()
    pod_dir = node.add_pod(parse_pod(raw))
    be_dir = node.layout.qos_dir(parse_pod(raw).kube_qos)
    server.upsert("nodes", make_node(NODE))
    server.upsert("pods", raw)
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    v1 = version is CgroupVersion.V1
    async with cluster_agent(tmp_path, server, node, GATES) as agent:
        weight = "blkio.cost.weight" if v1 else "io.weight"
        await wait_for(lambda: lines(node, be_dir, weight).get("253:16") == "40", what="BE weight 40")
        await more_rounds(agent, "BlkIOReconcile", 1)
        root_qos = "blkio.cost.qos" if v1 else "io.cost.qos"
        root_model = "blkio.cost.model" if v1 else "io.cost.model"
        assert node.read("", "blkio" if v1 else "", root_qos) == (
            "253:16 enable=1 ctrl=user rpct=90 rlat=1000 wpct=90 wlat=1000"
        )
        assert node.read("", "blkio" if v1 else "", root_model) == "253:16 ctrl=auto"
        if v1:
            # a synthetic file keeps only the last line written: that of each throttle file is the disk's
            assert lines(node, be_dir, "blkio.throttle.read_iops_device") == {"253:16": "1024"}
            assert lines(node, be_dir, "blkio.throttle.write_bps_device") == {"253:16": "1048576"}
            assert lines(node, pod_dir, "blkio.throttle.read_iops_device") == {"253:16": "2048"}
            assert lines(node, pod_dir, "blkio.throttle.write_iops_device") == {"253:16": "512"}
        else:
            # io.max gets one key per write; a key absent from io.max is "max", so an unlimited
            # key is not written at all: the last line written is wbps (BE) and wiops (pod)
            assert lines(node, be_dir, "io.max") == {"253:16": "wbps=1048576"}
            assert lines(node, pod_dir, "io.max") == {"253:16": "wiops=512"}
            decisions = [(d.target, d.new) for d in agent.decisions.recent(strategy="BlkIOReconcile")]
            assert (f"{pod_dir}/blkio.throttle.read_iops_device", "253:16 riops=2048") in decisions
        assert agent.parts.qos_manager.runners["BlkIOReconcile"].strategy.last_plan.problems == {}

        # disabling the BE class resets the disk's entries (throttles 0 = unlimited, weight 100)
        off = copy.deepcopy(SPEC)
        off["resourceQOSStrategy"]["beClass"]["blkioQOS"]["enable"] = False
        server.upsert("nodeslos", make_nodeslo(NODE, off))
        await wait_for(lambda: lines(node, be_dir, weight).get("253:16") == "100", what="BE weight reset")
        await more_rounds(agent, "BlkIOReconcile", 1)
        if v1:
            assert lines(node, be_dir, "blkio.throttle.read_iops_device") == {"253:16": "0"}
        else:
            assert lines(node, be_dir, "io.max") == {"253:16": "wbps=max"}


async def test_unresolvable_block_is_a_counted_problem_and_changes_nothing(
    tmp_path: Path, server: FakeAPIServer
) -> None:
    from koordqos.strategies.framework import INVALID_CONFIG

    node = SyntheticNode(tmp_path / "node", extensions=["blkio.cost.weight"])
    storage(node)
    spec = copy.deepcopy(SPEC)
    spec["resourceQOSStrategy"]["beClass"]["blkioQOS"]["blocks"][0]["name"] = "no-such-vg"
    server.upsert("nodes", make_node(NODE))
    server.upsert("nodeslos", make_nodeslo(NODE, spec))
    before = INVALID_CONFIG.labels("BlkIOReconcile")._value.get()
    async with cluster_agent(tmp_path, server, node, GATES) as agent:
        await more_rounds(agent, "BlkIOReconcile", 3)
        plan = agent.parts.qos_manager.runners["BlkIOReconcile"].strategy.last_plan
        assert "no-such-vg" in plan.problems["beClass"]
        assert INVALID_CONFIG.labels("BlkIOReconcile")._value.get() > before
        assert node.read("kubepods/besteffort", "blkio", "blkio.cost.weight") == "default 100"
        assert agent.parts.qos_manager.runners["BlkIOReconcile"].failures == 0


async def test_v2_with_koordlets_v1_only_behaviour_stays_idle(tmp_path: Path, server: FakeAPIServer) -> None:
    node = SyntheticNode(
        tmp_path / "node", CgroupVersion.V2, CgroupDriver.SYSTEMD, extensions=["blkio.cost.weight"]
    )
    storage(node)
    server.upsert("nodes", make_node(NODE))
    server.upsert("nodeslos", make_nodeslo(NODE, SPEC))
    qos = {"reconcile_interval_seconds": 0.05, "blkio_v2_io_files": False}
    async with cluster_agent(tmp_path, server, node, GATES, qos=qos) as agent:
        await more_rounds(agent, "BlkIOReconcile", 3)
        be_dir = node.layout.qos_dir(parse_pod(be_pod()).kube_qos)
        assert node.read(be_dir, "io", "io.weight") == "default 100"
        assert node.read(be_dir, "io", "io.max") == ""
        assert agent.parts.qos_manager.runners["BlkIOReconcile"].strategy.last_plan is None


async def test_local_mode_nri_pod_with_a_device_block_and_dry_run(short_dir: Path) -> None:
    from koordqos.nri.api import nri_api_pb2 as api

    from .conftest import local_agent

    node = SyntheticNode(short_dir / "node", extensions=["blkio.cost.weight"])
    storage(node)
    uid = "8b9c0d1e-1c2d-4e3f-9a0b-1c2d3e4f5a6b"
    ann = {
        "koordinator.sh/blkioQOS": json.dumps(
            {"blocks": [{"name": "/dev/vda1", "type": "device", "ioCfg": {"readBPS": 4096}}]}
        )
    }
    sandbox = api.PodSandbox(
        id="sbx" + "3" * 13,
        name="batch",
        uid=uid,
        namespace="default",
        labels={"koordinator.sh/qosClass": "BE", "io.kubernetes.pod.uid": uid},
        annotations=ann,
    )
    sandbox.linux.cgroup_parent = f"/kubepods/besteffort/pod{uid}"
    pod_dir = node.layout.normalize_parent(sandbox.linux.cgroup_parent)
    node.make_cgroup(pod_dir)
    async with local_agent(short_dir, node, {"spec": SPEC}, GATES) as (agent, runtime, _file):
        await runtime.run_pod_sandbox(sandbox)
        await wait_for(
            lambda: lines(node, pod_dir, "blkio.throttle.read_bps_device") == {"253:0": "4096"},
            what="the pod's throttle on vda (the disk of vda1)",
        )
        assert lines(node, "kubepods/besteffort", "blkio.cost.weight").get("253:16") == "40"
    # the same in dry-run: decisions, no file changed
    node2 = SyntheticNode(short_dir / "node2", extensions=["blkio.cost.weight"])
    storage(node2)
    node2.make_cgroup(pod_dir)
    async with local_agent(short_dir, node2, {"spec": SPEC}, GATES, dry_run=True) as (agent, runtime, _file):
        await runtime.run_pod_sandbox(sandbox)
        target = f"{pod_dir}/blkio.throttle.read_bps_device"
        await wait_for(
            lambda: any(d.target == target for d in agent.decisions.recent()), what="a dry-run decision"
        )
        assert all(d.dry_run for d in agent.decisions.recent(strategy="BlkIOReconcile"))
        assert lines(node2, pod_dir, "blkio.throttle.read_bps_device") == {}
        assert agent.services.executor.file_writes == 0
