"""GPU env and RDMA device injection as containerd/nri's real runtime code (`pkg/adaptation`) merges them.

The agent runs as a subprocess (local mode, gates GPUEnvInject and RDMADeviceInject on) against nripeer; the
merged CreateContainer adjustment must carry `NVIDIA_VISIBLE_DEVICES` and the RDMA char devices, with the
numbers of the device nodes under the agent's `--dev-root` (made with mknod for the test).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from koordqos.testing.nodefs import SyntheticNode

from .test_nripeer import container, peer, run_script

pytestmark = pytest.mark.e2e_runtime
__all__ = ["peer"]  # the module-scoped fixture, shared


def gpu_pod(pid: str, uid: str) -> dict[str, Any]:
    alloc = {"gpu": [{"minor": 0}, {"minor": 3}], "rdma": [{"minor": 0, "id": "0000:5e:00.0"}]}
    return {
        "id": pid,
        "name": pid,
        "uid": uid,
        "namespace": "conformance",
        "labels": {"koordinator.sh/qosClass": "LS"},
        "annotations": {"scheduling.koordinator.sh/device-allocated": json.dumps(alloc)},
        "linux": {"cgroup_parent": f"/kubepods/burstable/pod{uid}"},
    }


def test_gpu_env_and_rdma_devices_through_the_real_adaptation(peer: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the RDMA device nodes are made with mknod, which needs root")
    node = SyntheticNode(tmp_path / "node")
    dev = tmp_path / "dev" / "infiniband"
    dev.mkdir(parents=True)
    os.mknod(dev / "rdma_cm", stat.S_IFCHR | 0o666, os.makedev(10, 254))
    os.mknod(dev / "uverbs2", stat.S_IFCHR | 0o666, os.makedev(231, 194))
    (node.sys_root / "bus/pci/devices/0000:5e:00.0/infiniband_verbs/uverbs2").mkdir(parents=True)
    p = gpu_pod("gpu-sandbox", "0000cccc-0000-4000-8000-000000000001")
    node.make_cgroup(f"kubepods/burstable/pod{p['uid']}")
    ctr = container("9" * 64, p)
    script = {
        "pods": [p],
        "containers": [],
        "steps": [
            {"call": "RunPodSandbox", "pod": p["id"]},
            {"call": "CreateContainer", "pod": p["id"], "container": ctr},
        ],
    }
    out = run_script(
        peer,
        tmp_path,
        node,
        script,
        ("--feature-gates", "GPUEnvInject=true,RDMADeviceInject=true", "--dev-root", str(tmp_path / "dev")),
    )
    assert [r.get("error", "") for r in out["results"]] == ["", ""]
    adjust = out["results"][1]["response"]["adjust"]
    assert {e["key"]: e["value"] for e in adjust["env"]} == {"NVIDIA_VISIBLE_DEVICES": "0,3"}
    devices = [(d["path"], d["type"], int(d["major"]), int(d["minor"])) for d in adjust["linux"]["devices"]]
    assert devices == [("/dev/infiniband/rdma_cm", "c", 10, 254), ("/dev/infiniband/uverbs2", "c", 231, 194)]
    assert {d["file_mode"]["value"] for d in adjust["linux"]["devices"]} == {0o666}
