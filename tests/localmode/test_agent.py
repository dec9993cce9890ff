"""A local-mode agent in-process: a BE pod and its containers arrive over NRI from the mock runtime, and the
collector measures them per container (CPU usage, throttling, memory) on a synthetic node."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koordqos.agent import Agent
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.localsources import CGROUP_MISMATCH
from koordqos.metrics.collector import MetricsCollector
from koordqos.metrics.types import MetricKind
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

SEC = 1_000_000_000
UID = "5e6f7a8b-1c2d-4e3f-9a0b-1c2d3e4f5a6b"
CIDS = ("aaaa000000000001", "bbbb000000000002")


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time() - 1000  # in the past: the store's window ends at the real now

    def __call__(self) -> float:
        return self.now


def be_sandbox(driver: CgroupDriver) -> api.PodSandbox:
    pod = api.PodSandbox(
        id="sbx" + "0" * 13,
        name="batch-job",
        uid=UID,
        namespace="default",
        labels={"koordinator.sh/qosClass": "BE", "io.kubernetes.pod.uid": UID},
    )
    if driver is CgroupDriver.SYSTEMD:
        pod.linux.cgroup_parent = f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
    else:
        pod.linux.cgroup_parent = f"/kubepods/besteffort/pod{UID}"
    return pod


def container(pod: api.PodSandbox, cid: str, name: str, driver: CgroupDriver) -> api.Container:
    ctr = api.Container(id=cid, pod_sandbox_id=pod.id, name=name, state=api.CONTAINER_CREATED)
    ctr.linux.resources.cpu.shares.value = 2
    ctr.linux.resources.cpu.quota.value = -1
    parent = pod.linux.cgroup_parent
    if driver is CgroupDriver.SYSTEMD:
        ctr.linux.cgroups_path = f"{parent}:cri-containerd:{cid}"
    else:
        ctr.linux.cgroups_path = f"{parent}/{cid}"
    return ctr


def close(actual: float | None, expected: float) -> bool:
    """Within 1 % of the injected rate."""
    return actual is not None and abs(actual - expected) <= 0.01 * expected


@dataclass
class Env:
    node: SyntheticNode
    runtime: MockRuntime
    agent: Agent
    collector: MetricsCollector
    clock: FakeClock


COMBOS = [(CgroupVersion.V1, CgroupDriver.CGROUPFS), (CgroupVersion.V2, CgroupDriver.SYSTEMD)]
COMBO_IDS = ["v1-cgroupfs", "v2-systemd"]


@pytest.fixture(params=COMBOS, ids=COMBO_IDS)
async def env(request: pytest.FixtureRequest, short_dir: Path) -> AsyncIterator[Env]:
    """The agent reading every container's series (`--container-metrics=all`, koordlet's behaviour)."""
    async with agent_env(request.param, short_dir, {"container_metrics": "all"}) as e:
        yield e


@pytest.fixture(params=COMBOS, ids=COMBO_IDS)
async def default_env(request: pytest.FixtureRequest, short_dir: Path) -> AsyncIterator[Env]:
    """The agent with its default `--container-metrics` (needed)."""
    async with agent_env(request.param, short_dir, {}) as e:
        yield e


@contextlib.asynccontextmanager
async def agent_env(
    combo: tuple[CgroupVersion, CgroupDriver], short_dir: Path, metrics: dict[str, object]
) -> AsyncIterator[Env]:
    version, driver = combo
    node = SyntheticNode(short_dir / "node", version, driver)
    sock = short_dir / "nri.sock"
    runtime = MockRuntime(sock, runtime_name="containerd")
    await runtime.start()
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "nri": {"socket": str(sock), "backoff_seconds": 0.05, "backoff_cap_seconds": 0.2},
            # the collector's own loop runs once at start; the test drives the rounds it checks
            "metrics": {"collect_interval_seconds": 3600, **metrics},
            "kube": {"node_name": "local-node"},
        }
    )
    agent = Agent(cfg, packages=("metrics", "kube", "nri"), local_mode=True)
    run = asyncio.create_task(agent.run())
    try:
        await runtime.wait_joined(timeout=10)
        collector = agent.parts.collector
        await wait_until(lambda: collector.rounds >= 1, message="the collector's start-up round")
        clock = FakeClock()
        collector._clock = clock
        yield Env(node, runtime, agent, collector, clock)
    finally:
        agent.stop()
        await asyncio.wait_for(run, 10)
        await runtime.stop()


async def start_be_pod(env: Env) -> tuple[api.PodSandbox, list[api.Container]]:
    """The BE pod with its two containers, created and started over NRI, running in NodeState."""
    node, rt, lay = env.node, env.runtime, env.node.layout
    pod_pb = be_sandbox(lay.driver)
    ctrs = [
        container(pod_pb, cid, name, lay.driver) for cid, name in zip(CIDS, ("main", "sidecar"), strict=True)
    ]
    # the kubelet / runtime create the cgroups before the NRI events
    node.make_cgroup(lay.normalize_parent(pod_pb.linux.cgroup_parent))
    for c in ctrs:
        node.make_cgroup(lay.normalize_parent(c.linux.cgroups_path))
    await rt.run_pod_sandbox(pod_pb)
    for c in ctrs:
        await rt.create_container(pod_pb, c)
        c.state = api.CONTAINER_RUNNING
        await rt.start_container(pod_pb, c)

    def running() -> bool:
        pod = env.agent.bus.state.pods.get(UID)
        return pod is not None and [c.state for c in pod.containers] == ["running", "running"]

    await wait_until(running, message="the pod with both containers running")
    return pod_pb, ctrs


async def test_be_pod_containers_over_nri_are_measured_per_container(env: Env) -> None:
    node, rt, lay = env.node, env.runtime, env.node.layout
    mismatches = CGROUP_MISMATCH.labels("pod")._value.get() + CGROUP_MISMATCH.labels("container")._value.get()
    pod_pb, ctrs = await start_be_pod(env)
    pod = env.agent.bus.state.pods[UID]
    assert (pod.source, pod.qos, pod.kube_qos) == ("nri", QoSClass.BE, KubeQoS.BESTEFFORT)
    ids = [f"containerd://{cid}" for cid in CIDS]
    assert [c.container_id for c in pod.containers] == ids
    assert all(not c.requests and not c.limits for c in pod.containers)  # BestEffort: none
    # the dirs the collector reads are the ones the runtime reported
    assert lay.pod_dir(pod) == lay.normalize_parent(pod_pb.linux.cgroup_parent)
    for cid, c in zip(ids, ctrs, strict=True):
        assert lay.container_dir(pod, cid) == lay.normalize_parent(c.linux.cgroups_path)

    coll, clock = env.collector, env.clock
    await coll.round()  # baseline for the counters
    dt = 2.0
    clock.now += dt
    main_dir, side_dir = (lay.container_dir(pod, cid) for cid in ids)
    node.add_cpu_usage(lay.pod_dir(pod), int(0.75 * dt * SEC))
    node.add_cpu_usage(main_dir, int(0.6 * dt * SEC))
    node.add_cpu_usage(side_dir, int(0.15 * dt * SEC))
    node.add_throttling(main_dir, periods=20, throttled=8)
    node.add_throttling(side_dir, periods=20, throttled=0)
    node.set_memory(side_dir, 96 << 20, inactive_file=32 << 20)
    snap = await coll.round()

    sample = snap.pods[UID]
    main, side = sample.containers
    assert (main.id, main.name, side.id, side.name) == (ids[0], "main", ids[1], "sidecar")
    assert close(main.cpu_usage_cores, 0.6)
    assert close(side.cpu_usage_cores, 0.15)
    assert main.throttled_ratio == 0.4
    assert side.throttled_ratio == 0.0
    assert side.memory_working_set == 64 << 20
    store = env.agent.services.metric_store
    assert store.last(MetricKind.CONTAINER_CPU_THROTTLED, ids[0]) == 0.4
    assert close(store.last(MetricKind.CONTAINER_CPU_USAGE, ids[0]), 0.6)

    # the sidecar goes away: the pod is republished without it and it is no longer measured
    ctrs[1].state = api.CONTAINER_STOPPED
    await rt.stop_container(pod_pb, ctrs[1])
    await rt.remove_container(pod_pb, ctrs[1])
    await wait_until(
        lambda: [c.name for c in env.agent.bus.state.pods[UID].containers] == ["main"],
        message="the pod without its removed container",
    )
    clock.now += 1
    snap = await coll.round()
    assert [c.id for c in snap.pods[UID].containers] == [ids[0]]
    after = CGROUP_MISMATCH.labels("pod")._value.get() + CGROUP_MISMATCH.labels("container")._value.get()
    assert after == mismatches


async def test_default_agent_reads_only_the_pod_files_when_nothing_needs_a_container(
    default_env: Env,
) -> None:
    """--container-metrics=needed (the default) without CPU burst: the pod is measured from its own three
    files; no container file is opened and no container series is stored."""
    env = default_env
    node, lay = env.node, env.node.layout
    await start_be_pod(env)
    pod = env.agent.bus.state.pods[UID]
    pod_dir = lay.pod_dir(pod)
    coll, clock = env.collector, env.clock
    await coll.round()
    clock.now += 2.0
    node.add_cpu_usage(pod_dir, int(0.75 * 2.0 * SEC))
    for cid in CIDS:
        node.add_cpu_usage(lay.container_dir(pod, f"containerd://{cid}"), int(0.3 * 2.0 * SEC))
    snap = await coll.round()

    sample = snap.pods[UID]
    assert close(sample.cpu_usage_cores, 0.75)
    assert sample.memory_working_set is not None
    assert sample.containers == ()
    plan = coll._plans[UID]
    assert {rel for rel, _sub, _name in plan.files.entries} == {pod_dir}
    assert len(plan.files.entries) == 3
    store = env.agent.services.metric_store
    for kind in (
        MetricKind.CONTAINER_CPU_USAGE,
        MetricKind.CONTAINER_MEMORY_USAGE,
        MetricKind.CONTAINER_CPU_THROTTLED,
    ):
        assert store.keys(kind) == []
