"""MetricsCollector against a synthetic /proc + cgroup tree whose counters the test advances."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from koordqos.agent import Agent, build_services
from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.decisions import DecisionLog
from koordqos.events.types import MetricTick, PodDeleted, PodUpserted
from koordqos.metrics.collector import ContainerDemand, MetricsCollector
from koordqos.metrics.store import MetricStore
from koordqos.metrics.telemetry import MISSING
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricKind, MetricSnapshot
from koordqos.model.keys import BATCH_CPU, LABEL_QOS
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState
from koordqos.testing.loopturns import counting
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

SEC = 1_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


BE_POD = PodInfo(
    uid="be-pod-1",
    namespace="ns",
    name="be",
    kube_qos=KubeQoS.BESTEFFORT,
    labels={LABEL_QOS: "BE"},
    containers=(
        ContainerInfo(name="a", container_id="containerd://aaa111", requests={BATCH_CPU: 500}),
        ContainerInfo(name="b", container_id="containerd://bbb222", requests={BATCH_CPU: 1500}),
        ContainerInfo(name="pending"),  # not started: no id, not measured
    ),
)
LS_POD = PodInfo(
    uid="ls-pod-1",
    namespace="ns",
    name="ls",
    kube_qos=KubeQoS.BURSTABLE,
    containers=(ContainerInfo(name="main", container_id="docker://ccc333", requests={"cpu": 1000}),),
)
DONE_POD = PodInfo(uid="done-pod", kube_qos=KubeQoS.BESTEFFORT, phase="Succeeded")


def close(actual: float | None, expected: float) -> bool:
    """Within 1 % of the injected rate."""
    return actual is not None and abs(actual - expected) <= 0.01 * abs(expected)


async def setup_collector(
    node: SyntheticNode, *pods: PodInfo, container_demand: ContainerDemand | None = None
) -> tuple[MetricsCollector, EventBus, MetricStore, FakeClock]:
    bus = EventBus()
    for pod in pods:
        node.add_pod(pod)
        await bus.publish(PodUpserted(pod))
    clock = FakeClock()
    store = MetricStore(retention_seconds=600, collect_interval=1.0, clock=clock)
    coll = MetricsCollector(
        bus,
        node.layout,
        CgroupReader(node.layout),
        store,
        proc_root=node.proc_root,
        topology=read_topology(node.sys_root),
        interval=1.0,
        clock=clock,
        container_demand=container_demand,
    )
    return coll, bus, store, clock


def missing(source: str) -> float:
    return MISSING.labels(source)._value.get()


async def test_rates_match_injected_counters(node: SyntheticNode) -> None:
    coll, bus, store, clock = await setup_collector(node, BE_POD, LS_POD, DONE_POD)
    lay = node.layout
    be_dir, be_pod_dir, ls_dir = lay.qos_dirs()[2], lay.pod_dir(BE_POD), lay.pod_dir(LS_POD)
    ca = lay.container_dir(BE_POD, "containerd://aaa111")
    cc = lay.container_dir(LS_POD, "docker://ccc333")

    first = await coll.round()
    assert first.node.cpu_usage_cores is None  # no delta yet
    assert first.pods[BE_POD.uid].cpu_usage_cores is None
    assert "done-pod" not in first.pods  # terminated pods are not measured

    dt = 2.0
    clock.now += dt
    node.advance_node_cpu(busy_ticks=int(1.5 * dt * 100), idle_ticks=int(2.5 * dt * 100))  # 1.5 of 4 cores
    node.add_cpu_usage(be_dir, int(0.9 * dt * SEC))
    node.add_cpu_usage(be_pod_dir, int(0.9 * dt * SEC))
    node.add_cpu_usage(ca, int(0.3 * dt * SEC))
    node.add_cpu_usage(ls_dir, int(0.45 * dt * SEC))
    node.add_cpu_usage(cc, int(0.45 * dt * SEC))
    node.add_throttling(ca, periods=20, throttled=5)
    node.set_memory(be_pod_dir, 300 << 20, inactive_file=100 << 20)
    node.set_memory(cc, 64 << 20, inactive_file=0)
    if node.version is CgroupVersion.V1:
        node.write(be_dir, "cpuset", "cpuset.cpus", "0-1")
        node.write(be_dir, "cpu", "cpu.cfs_quota_us", 150000)
    else:
        node.write(be_dir, "cpuset", "cpuset.cpus", "0-1")
        node.write(be_dir, "cpu", "cpu.max", "150000 100000")

    snap = await coll.round()
    assert close(snap.node.cpu_usage_cores, 1.5)
    be = snap.pods[BE_POD.uid]
    assert close(be.cpu_usage_cores, 0.9)
    assert be.memory_working_set == 200 << 20
    a, b = be.containers
    assert (a.id, a.name, b.name) == ("containerd://aaa111", "a", "b")
    assert close(a.cpu_usage_cores, 0.3)
    assert b.cpu_usage_cores == 0.0
    assert a.throttled_ratio == 0.25
    assert b.throttled_ratio == 0.0  # no period elapsed → 0
    ls = snap.pods[LS_POD.uid]
    assert close(ls.cpu_usage_cores, 0.45)
    assert snap.container("docker://ccc333") is not None
    assert ls.containers[0].memory_working_set == 64 << 20
    # BE aggregate: usage in milli, Σ batch-cpu requests, min(cpuset 2 CPUs, quota 1.5 CPUs)
    assert snap.be.usage_milli is not None
    assert abs(snap.be.usage_milli - 900) <= 9
    assert snap.be.request_milli == 2000
    assert snap.be.real_limit_milli == 1500
    assert snap.be.cpuset == frozenset({0, 1})
    # node memory from meminfo: total 16 GiB, available 8 GiB, free 4 GiB
    assert snap.node.memory_total == 16 << 30
    assert snap.node.memory_used == 8 << 30
    assert snap.node.memory_used_with_cache == 12 << 30
    assert snap.node.cpu_count == 4
    # published and stored
    assert isinstance(bus.state.last_tick, MetricTick)
    assert bus.state.last_tick.sample is snap
    assert bus.state.last_tick.at == clock.now
    assert close(store.last(MetricKind.POD_CPU_USAGE, BE_POD.uid), 0.9)
    assert close(store.last(MetricKind.NODE_CPU_USAGE), 1.5)
    assert store.last(MetricKind.CONTAINER_CPU_THROTTLED, "containerd://aaa111") == 0.25
    assert store.last(MetricKind.BE_CPU_REAL_LIMIT) == 1500


async def test_real_limit_cpuset_only_when_quota_unlimited(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, cpus=8)
    coll, *_ = await setup_collector(node)
    node.write("kubepods/besteffort", "cpuset", "cpuset.cpus", "2-4")
    snap = await coll.round()
    assert snap.be.real_limit_milli == 3000
    assert snap.be.quota == -1


async def test_vanished_pod_logged_once_counted_and_collection_continues(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    coll, bus, _store, clock = await setup_collector(node, BE_POD, LS_POD)
    await coll.round()
    node.remove_cgroup(node.layout.pod_dir(BE_POD))
    before = missing("cgroup_vanished")
    clock.now += 1
    snap = await coll.round()
    assert BE_POD.uid not in snap.pods
    assert LS_POD.uid in snap.pods
    assert missing("cgroup_vanished") == before + 1
    clock.now += 1
    await coll.round()
    assert missing("cgroup_vanished") == before + 2  # counted every round…
    assert f"pod:{BE_POD.uid}" in coll._warned  # …logged once
    assert coll.rounds == 3
    assert bus.state.last_tick is not None


async def test_missing_proc_files_tolerated(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    coll, *_ = await setup_collector(node, LS_POD)
    (node.proc_root / "stat").unlink()
    (node.proc_root / "meminfo").unlink()
    before = missing("proc_stat")
    snap = await coll.round()
    assert snap.node.cpu_usage_cores is None
    assert snap.node.memory_total is None
    assert snap.node.memory_used is None
    assert LS_POD.uid in snap.pods
    assert missing("proc_stat") == before + 1


async def test_counter_reset_gives_no_rate(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    coll, _bus, _store, clock = await setup_collector(node, LS_POD)
    rel = node.layout.pod_dir(LS_POD)
    node.add_cpu_usage(rel, 10 * SEC)
    await coll.round()
    node.write(rel, "cpuacct", "cpuacct.usage", 0)  # cgroup recreated
    clock.now += 1
    snap = await coll.round()
    assert snap.pods[LS_POD.uid].cpu_usage_cores is None


async def test_deleted_pod_series_dropped(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    coll, bus, store, clock = await setup_collector(node, BE_POD)
    await coll.round()
    clock.now += 1
    await coll.round()
    assert store.count(MetricKind.POD_CPU_USAGE, BE_POD.uid, window=10) == 1
    assert store.count(MetricKind.CONTAINER_MEMORY_USAGE, "containerd://aaa111", window=10) == 2
    await bus.publish(PodDeleted(BE_POD.uid))
    clock.now += 1
    await coll.round()
    assert store.count(MetricKind.POD_CPU_USAGE, BE_POD.uid, window=10) == 0
    assert store.count(MetricKind.CONTAINER_MEMORY_USAGE, "containerd://aaa111", window=10) == 0
    assert BE_POD.uid not in store.keys(MetricKind.POD_MEMORY_USAGE)


async def test_a_pod_that_never_gave_a_sample_leaves_no_plan_when_it_goes(tmp_path: Path) -> None:
    # a runtime-reported pod with a made-up uid has no cgroup dir: no sample, so the store never drops it;
    # its plan (open files, PodInfo, reader dir memo) must still go with the pod (the fuzz run's RSS growth)
    node = SyntheticNode(tmp_path)
    coll, bus, _store, clock = await setup_collector(node, LS_POD)
    ghosts = [PodInfo(uid=f"ghost-{i}", kube_qos=KubeQoS.BESTEFFORT) for i in range(20)]
    for ghost in ghosts:
        await bus.publish(PodUpserted(ghost))
    snap = await coll.round()
    assert set(snap.pods) == {LS_POD.uid}
    assert len(coll._plans) == 21
    dirs_with_ghosts = len(coll.reader._dirs)
    for ghost in ghosts:
        await bus.publish(PodDeleted(ghost.uid))
    clock.now += 1
    snap = await coll.round()
    assert set(coll._plans) == {LS_POD.uid}
    assert len(coll.reader._dirs) < dirs_with_ghosts
    assert not any("ghost-" in rel for _sub, rel in coll.reader._dirs)
    assert snap.pods[LS_POD.uid].memory_working_set is not None  # the pod that stays is still measured


async def test_many_pods_leaving_at_once_are_dropped_in_slices(tmp_path: Path) -> None:
    # a drain: every pod's files closed and its dirs forgotten, DROP_SLICE pods per loop step
    from koordqos.metrics.collector import DROP_SLICE

    node = SyntheticNode(tmp_path)
    pods = [
        PodInfo(
            uid=f"p-{i}",
            kube_qos=KubeQoS.BESTEFFORT,
            containers=(ContainerInfo(name="c", container_id=f"containerd://c{i}"),),
        )
        for i in range(3 * DROP_SLICE + 1)
    ]
    coll, bus, store, clock = await setup_collector(node, *pods)
    await coll.round()
    assert len(coll._plans) == len(pods)
    open_before = coll.reader.open_files
    assert open_before > 0
    async with counting() as turns:
        await coll._drop_plans([pod.uid for pod in pods])  # what a round does with the pods that left
    assert turns.count == 3  # 193 pods: 4 slices, the loop ran in between
    assert coll._plans == {}
    assert coll.reader.open_files <= open_before - len(pods)  # at least each pod's own file closed
    assert not [rel for _sub, rel in coll.reader._dirs if "/podp-" in rel]
    for pod in pods:
        await bus.publish(PodDeleted(pod.uid))
    clock.now += 1
    await coll.round()
    assert store.keys(MetricKind.POD_CPU_USAGE) == []


async def test_hostile_pod_uid_not_measured(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    coll, bus, *_ = await setup_collector(node)
    evil = PodInfo(uid="../../../etc", kube_qos=KubeQoS.BESTEFFORT)
    await bus.publish(PodUpserted(evil))
    before = missing("bad_pod")
    snap = await coll.round()
    assert evil.uid not in snap.pods
    assert missing("bad_pod") == before + 1


async def test_run_publishes_ticks_until_cancelled(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    coll, bus, *_ = await setup_collector(node, LS_POD)
    coll.interval = 0.01
    ticks: list[MetricSnapshot] = []
    enough = asyncio.Event()

    async def on_tick(event: MetricTick, state: NodeState) -> None:
        ticks.append(event.sample)
        if len(ticks) >= 3:
            enough.set()

    bus.subscribe("test", on_tick, MetricTick)
    async with asyncio.TaskGroup() as tg:
        bus_task = tg.create_task(bus.run())
        run_task = tg.create_task(coll.run())
        await asyncio.wait_for(enough.wait(), timeout=10)
        run_task.cancel()
        bus_task.cancel()
    assert len(ticks) >= 3
    assert all(LS_POD.uid in t.pods for t in ticks)


async def test_build_services_and_the_collector(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "metrics": {"collect_interval_seconds": 2, "retention_seconds": 60},
            "executor": {"resource_force_update_seconds": 30},
        }
    )
    svc = build_services(cfg, True, EventBus(), DecisionLog(), {})
    layout = svc.layout
    assert (layout.version, layout.driver) == (CgroupVersion.V2, CgroupDriver.SYSTEMD)
    assert svc.executor.force_update_seconds == 30
    assert svc.reader.layout is layout
    assert svc.metric_store.retention == 60
    assert len(svc.topology) == 4
    agent = Agent(cfg, packages=("metrics",), local_mode=True)
    agent.build()
    collector = agent.parts.collector
    assert collector is not None
    assert [c for c in agent.components if isinstance(c, MetricsCollector)] == [collector]
    assert collector.name == "metrics-collector"
    assert collector.interval == 2
    snap = await collector.round()
    assert snap.node.memory_total == 16 << 30


@pytest.mark.parametrize("dry_run", [True, False])
def test_executor_dry_run_follows_config(tmp_path: Path, dry_run: bool) -> None:
    node = SyntheticNode(tmp_path)
    cfg = build_config({"paths": {"cgroup_root": str(node.cgroup_root)}, "dry_run": dry_run})
    svc = build_services(cfg, True, EventBus(), DecisionLog(dry_run=dry_run), {})
    assert svc.executor.dry_run is dry_run


async def test_failing_round_is_counted_and_loop_continues(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    coll, bus, *_ = await setup_collector(node, LS_POD)
    coll.interval = 0.01
    calls = 0
    real_collect = coll.collect

    async def flaky() -> MetricSnapshot:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("boom")
        return await real_collect()

    coll.collect = flaky  # type: ignore[method-assign]
    with capture_logs() as logs:
        task = asyncio.create_task(coll.run())
        try:
            await wait_until(lambda: coll.rounds >= 1, timeout=10, message="a successful collection round")
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert calls >= 3
    failed = [e["error"] for e in logs if e["event"] == "metrics round failed"]
    assert failed == ["RuntimeError: boom"]  # two failures, logged once
    assert bus.state.last_tick is not None
