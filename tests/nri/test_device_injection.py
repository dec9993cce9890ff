"""GPUEnvInject and RDMADeviceInject through NRI: the agent (local mode) and the mock runtime over a real unix
socket; what the CreateContainer adjustment carries (env, mounts, device nodes)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from koordqos.agent import Agent
from koordqos.config import build_config
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.nodefs import SyntheticNode

ALLOC = "scheduling.koordinator.sh/device-allocated"


def pod(uid: str, alloc: dict[str, object], labels: dict[str, str] | None = None) -> api.PodSandbox:
    p = api.PodSandbox(
        id=f"sb-{uid}",
        name=f"pod-{uid}",
        uid=uid,
        namespace="default",
        labels=labels or {},
        annotations={ALLOC: json.dumps(alloc)},
    )
    p.linux.cgroup_parent = f"/kubepods/pod{uid}"
    return p


def container(p: api.PodSandbox, cid: str) -> api.Container:
    ctr = api.Container(id=cid, pod_sandbox_id=p.id, name="main", state=api.CONTAINER_CREATED, env=["A=1"])
    ctr.linux.cgroups_path = f"{p.linux.cgroup_parent}/{cid}"
    return ctr


@pytest.fixture
async def runtime() -> AsyncIterator[tuple[MockRuntime, SyntheticNode]]:
    if os.geteuid() != 0:
        pytest.skip("the RDMA device nodes are made with mknod, which needs root")
    base = Path(tempfile.mkdtemp(prefix="kqdev-", dir="/tmp"))
    node = SyntheticNode(base / "node")
    dev_root = base / "dev"
    (dev_root / "infiniband").mkdir(parents=True)
    os.mknod(dev_root / "infiniband" / "rdma_cm", stat.S_IFCHR | 0o666, os.makedev(10, 255))
    os.mknod(dev_root / "infiniband" / "uverbs1", stat.S_IFCHR | 0o666, os.makedev(231, 193))
    (node.sys_root / "bus" / "pci" / "devices" / "0000:3b:00.1" / "infiniband_verbs" / "uverbs1").mkdir(
        parents=True
    )
    sock = base / "nri" / "nri.sock"
    rt = MockRuntime(sock, request_timeout=2.0)
    await rt.start()
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
                "dev_root": str(dev_root),
            },
            "nri": {"socket": str(sock), "backoff_seconds": 0.05, "backoff_cap_seconds": 0.2},
            "kube": {"node_name": "n1"},
            "feature_gates": {"GPUEnvInject": True, "RDMADeviceInject": True},
        }
    )
    agent = Agent(cfg, packages=("kube", "hooks", "nri"), local_mode=True)
    run = asyncio.create_task(agent.run())
    try:
        await rt.wait_joined(timeout=10)
        yield rt, node
    finally:
        agent.stop()
        await asyncio.wait_for(run, 10)
        await rt.stop()
        shutil.rmtree(base, ignore_errors=True)


async def test_gpu_env_and_rdma_devices_in_the_adjustment(runtime: tuple[MockRuntime, SyntheticNode]) -> None:
    rt, node = runtime
    p = pod("dev-0001", {"gpu": [{"minor": 2}, {"minor": 3}], "rdma": [{"minor": 0, "id": "0000:3b:00.1"}]})
    node.make_cgroup(node.layout.normalize_parent(p.linux.cgroup_parent))
    await rt.run_pod_sandbox(p)
    resp = await rt.create_container(p, container(p, "c" * 64))
    assert resp is not None
    assert {e.key: e.value for e in resp.adjust.env} == {"NVIDIA_VISIBLE_DEVICES": "2,3"}
    devices = [(d.path, d.type, d.major, d.minor, d.file_mode.value) for d in resp.adjust.linux.devices]
    assert devices == [
        ("/dev/infiniband/rdma_cm", "c", 10, 255, 0o666),
        ("/dev/infiniband/uverbs1", "c", 231, 193, 0o666),
    ]


async def test_hami_core_mounts_in_the_adjustment(runtime: tuple[MockRuntime, SyntheticNode]) -> None:
    rt, node = runtime
    res = {
        "koordinator.sh/gpu-memory": "8Gi",
        "koordinator.sh/gpu-memory-ratio": "25",
        "koordinator.sh/gpu-core": "25",
    }
    p = pod(
        "dev-0002",
        {"gpu": [{"minor": 0, "resources": res}]},
        {"koordinator.sh/gpu-isolation-provider": "HAMi-core"},
    )
    node.make_cgroup(node.layout.normalize_parent(p.linux.cgroup_parent))
    await rt.run_pod_sandbox(p)
    resp = await rt.create_container(p, container(p, "d" * 64))
    assert resp is not None
    env = {e.key: e.value for e in resp.adjust.env}
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == str(8 << 30)
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    mounts = [(m.destination, m.source, m.type, list(m.options)) for m in resp.adjust.mounts]
    assert mounts == [
        ("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", "bind", ["rbind"]),
        ("/tmp/vgpulock", "/tmp/vgpulock", "bind", ["rbind"]),
    ]


async def test_a_pod_whose_device_is_missing_still_gets_its_container(
    runtime: tuple[MockRuntime, SyntheticNode],
) -> None:
    """Under the default Ignore policy a failing hook is logged and the others' values are still sent."""
    rt, node = runtime
    p = pod("dev-0003", {"gpu": [{"minor": 5}], "rdma": [{"minor": 0, "id": "0000:99:00.0"}]})
    node.make_cgroup(node.layout.normalize_parent(p.linux.cgroup_parent))
    await rt.run_pod_sandbox(p)
    resp = await rt.create_container(p, container(p, "e" * 64))
    assert resp is not None
    assert {e.key: e.value for e in resp.adjust.env} == {"NVIDIA_VISIBLE_DEVICES": "5"}
    assert list(resp.adjust.linux.devices) == []
