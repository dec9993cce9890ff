"""The agent with the mock NRI runtime on a synthetic node (cgroup v1 and v2): what the runtime receives and
what lands in the cgroup files."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koordqos.agent import Agent
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.events.types import NodeSLOUpdated
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.testing.mock_nri.link import PluginLink
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

GI = 1 << 30
ERS = "node.koordinator.sh/extended-resource-spec"


def be_pod(uid: str, cpu_limit: int, mem_limit: str, cpu_request: int) -> api.PodSandbox:
    spec = {
        "containers": {
            "main": {
                "requests": {
                    "kubernetes.io/batch-cpu": str(cpu_request),
                    "kubernetes.io/batch-memory": mem_limit,
                },
                "limits": {
                    "kubernetes.io/batch-cpu": str(cpu_limit),
                    "kubernetes.io/batch-memory": mem_limit,
                },
            }
        }
    }
    pod = api.PodSandbox(
        id=f"sb-{uid}",
        name=f"pod-{uid}",
        uid=uid,
        namespace="default",
        labels={"koordinator.sh/qosClass": "BE"},
        annotations={ERS: json.dumps(spec)},
    )
    pod.linux.cgroup_parent = f"/kubepods/besteffort/pod{uid}"
    return pod


def container(pod: api.PodSandbox, cid: str, state: int = api.CONTAINER_RUNNING) -> api.Container:
    ctr = api.Container(
        id=cid,
        pod_sandbox_id=pod.id,
        name="main",
        state=state,  # type: ignore[arg-type]
        env=["A=1"],
    )
    ctr.linux.resources.cpu.shares.value = 2
    ctr.linux.resources.cpu.quota.value = -1
    ctr.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{cid}"
    return ctr


@dataclass
class Env:
    node: SyntheticNode
    runtime: MockRuntime
    agent: Agent
    link: PluginLink

    def cpu(self, rel: str, name: str) -> str:
        return self.node.read(rel, "cpu", name)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kqhooks-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=[CgroupVersion.V1, CgroupVersion.V2], ids=["v1", "v2"])
async def env(request: pytest.FixtureRequest, short_dir: Path) -> AsyncIterator[Env]:
    version: CgroupVersion = request.param
    node = SyntheticNode(short_dir / "node", version, CgroupDriver.CGROUPFS, extensions=("cpu.bvt_warp_ns",))
    # an existing BE pod and container, present when the plugin (re)connects
    old = be_pod("old-0001", 1000, "1Gi", 500)
    old_ctr = container(old, "oldc0001")
    node.make_cgroup(node.layout.normalize_parent(old.linux.cgroup_parent))
    node.make_cgroup(node.layout.normalize_parent(old_ctr.linux.cgroups_path))
    sock = short_dir / "nri" / "nri.sock"
    runtime = MockRuntime(sock, request_timeout=2.0)
    runtime.pods, runtime.containers = [old], [old_ctr]
    await runtime.start()
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "nri": {"socket": str(sock), "backoff_seconds": 0.05, "backoff_cap_seconds": 0.2},
            "hooks": {"reconcile_interval_seconds": 0.2},
            "executor": {"resource_force_update_seconds": 0},
            "kube": {"node_name": "n1"},
        }
    )
    agent = Agent(
        cfg,
        packages=("kube", "hooks", "nri"),
        local_mode=True,
    )
    run = asyncio.create_task(agent.run())
    try:
        link = await runtime.wait_joined(timeout=10)
        yield Env(node, runtime, agent, link)
    finally:
        agent.stop()
        await asyncio.wait_for(run, 10)
        await runtime.stop()


async def test_existing_be_container_is_corrected_at_synchronize(env: Env) -> None:
    updates = {u.container_id: u for u in env.link.sync_updates}
    assert set(updates) == {"oldc0001"}
    res = updates["oldc0001"].linux.resources
    assert res.cpu.quota.value == 100000
    assert res.cpu.shares.value == 512
    assert res.memory.limit.value == GI


async def test_be_pod_gets_batch_limits_in_adjustment_and_cgroup_files(env: Env) -> None:
    node = env.node
    pod = be_pod("new-0002", 2000, "4Gi", 1500)
    pod_dir = node.layout.normalize_parent(pod.linux.cgroup_parent)
    node.make_cgroup(pod_dir)  # the kubelet creates the pod cgroup before RunPodSandbox
    await env.runtime.run_pod_sandbox(pod)
    v2 = node.version is CgroupVersion.V2
    if v2:
        assert node.read(pod_dir, "cpu", "cpu.max").split()[0] == "200000"
        assert node.read(pod_dir, "cpu", "cpu.weight") == str(1 + ((1536 - 2) * 9999) // 262142)
        assert node.read(pod_dir, "memory", "memory.max") == "4294967296"
    else:
        assert env.cpu(pod_dir, "cpu.cfs_quota_us") == "200000"
        assert env.cpu(pod_dir, "cpu.shares") == "1536"
        assert node.read(pod_dir, "memory", "memory.limit_in_bytes") == "4294967296"

    ctr = container(pod, "newc0002", api.CONTAINER_CREATED)
    resp = await env.runtime.create_container(pod, ctr)
    assert resp is not None
    res = resp.adjust.linux.resources
    assert (res.cpu.quota.value, res.cpu.shares.value, res.memory.limit.value) == (200000, 1536, 4 * GI)
    assert not resp.update  # no update may name the container being created

    # the container's cgroup appears; the reconciler sets its files too
    cdir = node.layout.normalize_parent(ctr.linux.cgroups_path)
    node.make_cgroup(cdir)
    quota = (
        (lambda: node.read(cdir, "cpu", "cpu.max").split()[0])
        if v2
        else (lambda: node.read(cdir, "cpu", "cpu.cfs_quota_us"))
    )
    await wait_until(lambda: quota() == "200000", message="quota 200000")

    # a value changed behind the agent's back is restored by the reconciler
    if v2:
        node.write(pod_dir, "cpu", "cpu.max", "max 100000")
        await wait_until(
            lambda: node.read(pod_dir, "cpu", "cpu.max").split()[0] == "200000", message="cpu.max = 200000"
        )
    else:
        node.write(pod_dir, "cpu", "cpu.cfs_quota_us", -1)
        await wait_until(
            lambda: env.cpu(pod_dir, "cpu.cfs_quota_us") == "200000", message="cpu.cfs_quota_us = 200000"
        )


async def test_update_container_names_its_container(env: Env) -> None:
    pod = env.runtime.pods[0]
    ctr = env.runtime.containers[0]
    requested = api.LinuxResources()
    requested.cpu.quota.value = -1
    resp = await env.runtime.update_container(pod, ctr, requested)
    assert resp is not None
    assert [u.container_id for u in resp.update] == [ctr.id]
    assert resp.update[0].linux.resources.cpu.quota.value == 100000


async def test_lsr_pod_gets_its_cpuset(env: Env) -> None:
    pod = api.PodSandbox(
        id="sb-lsr",
        name="lsr",
        uid="lsr-0003",
        namespace="default",
        labels={"koordinator.sh/qosClass": "LSR"},
        annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"2-3"}'},
    )
    pod.linux.cgroup_parent = "/kubepods/podlsr-0003"
    ctr = container(pod, "lsrc0003", api.CONTAINER_CREATED)
    ctr.linux.resources.cpu.quota.value = 200000
    resp = await env.runtime.create_container(pod, ctr)
    assert resp is not None
    assert resp.adjust.linux.resources.cpu.cpus == "2-3"
    assert resp.adjust.linux.resources.cpu.quota.value == -1


async def test_nodeslo_change_reapplies_bvt(env: Env) -> None:
    node = env.node
    be_dir = node.layout.normalize_parent(env.runtime.pods[0].linux.cgroup_parent)
    besteffort = node.layout.qos_dirs()[2]
    await wait_until(lambda: env.cpu(be_dir, "cpu.bvt_warp_ns") == "0", message="cpu.bvt_warp_ns = 0")
    slo = parse_nodeslo(
        {
            "resourceQOSStrategy": {
                "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
                "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
            }
        }
    )
    await env.agent.bus.publish(NodeSLOUpdated(slo))
    await wait_until(lambda: env.cpu(be_dir, "cpu.bvt_warp_ns") == "-1", message="cpu.bvt_warp_ns = -1")
    await wait_until(lambda: env.cpu(besteffort, "cpu.bvt_warp_ns") == "-1", message="cpu.bvt_warp_ns = -1")
    # one reconcile pass writes these too; the executor yields between slices of a pass, so wait for them
    await wait_until(
        lambda: env.cpu(node.layout.qos_dirs()[1], "cpu.bvt_warp_ns") == "2", message="cpu.bvt_warp_ns = 2"
    )
    cdir = node.layout.normalize_parent(env.runtime.containers[0].linux.cgroups_path)
    await wait_until(
        lambda: env.cpu(cdir, "cpu.bvt_warp_ns") == "-1", message="cpu.bvt_warp_ns = -1"
    )  # container dirs follow a rule change
