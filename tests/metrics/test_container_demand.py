"""The collector's container demand: which containers' cgroup files it opens and reads each round.

Synthetic nodes (every cgroup version and driver); the demand is a plain function of (pod, NodeState) here,
the agent's (CPU burst's needs) is tested in tests/strategies/test_cpuburst_demand.py.
"""

from __future__ import annotations

from koordqos.bus import EventBus
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.events.types import NodeSLOUpdated, PodUpserted
from koordqos.metrics.collector import MetricsCollector
from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import ContainerSeries, MetricKind
from koordqos.model.nodeslo import NodeSLO, parse_nodeslo
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState
from koordqos.testing.nodefs import SyntheticNode

from .test_collector import BE_POD, LS_POD, SEC, FakeClock, close, setup_collector

CA, CB, CC = "containerd://aaa111", "containerd://bbb222", "docker://ccc333"
CONTAINER_KINDS = (
    MetricKind.CONTAINER_CPU_USAGE,
    MetricKind.CONTAINER_MEMORY_USAGE,
    MetricKind.CONTAINER_CPU_THROTTLED,
)


class Demand:
    """A demand answering from a table by pod uid (default NONE), counting its calls per uid."""

    def __init__(self, table: dict[str, ContainerSeries] | None = None) -> None:
        self.table = dict(table or {})
        self.calls: dict[str, int] = {}

    def __call__(self, pod: PodInfo, state: NodeState) -> ContainerSeries:
        self.calls[pod.uid] = self.calls.get(pod.uid, 0) + 1
        return self.table.get(pod.uid, ContainerSeries.NONE)


async def setup(
    node: SyntheticNode, demand: Demand | None, *pods: PodInfo
) -> tuple[MetricsCollector, EventBus, MetricStore, FakeClock, CgroupReader]:
    coll, bus, store, clock = await setup_collector(node, *pods, container_demand=demand)
    return coll, bus, store, clock, coll.reader


def slo(policy: str) -> NodeSLO:
    return parse_nodeslo({"spec": {"cpuBurstStrategy": {"policy": policy}}})


def files(coll: MetricsCollector, pod: PodInfo) -> list[tuple[str, str, str]]:
    return list(coll._plans[pod.uid].files.entries)


def busy(node: SyntheticNode, clock: FakeClock, dt: float = 2.0) -> None:
    """dt seconds of work: pods 0.9 / 0.45 cores, container a 0.3 (throttled 5 of 20), c 0.45 (64 MiB)."""
    lay = node.layout
    clock.now += dt
    node.add_cpu_usage(lay.pod_dir(BE_POD), int(0.9 * dt * SEC))
    node.add_cpu_usage(lay.pod_dir(LS_POD), int(0.45 * dt * SEC))
    ca, cc = lay.container_dir(BE_POD, CA), lay.container_dir(LS_POD, CC)
    node.add_cpu_usage(ca, int(0.3 * dt * SEC))
    node.add_cpu_usage(cc, int(0.45 * dt * SEC))
    node.add_throttling(ca, periods=20, throttled=5)
    node.add_throttling(cc, periods=20, throttled=10)
    node.set_memory(cc, 64 << 20, inactive_file=0)


async def test_no_container_file_is_opened_when_nothing_needs_one(node: SyntheticNode) -> None:
    coll, _bus, store, clock, reader = await setup(node, Demand(), BE_POD, LS_POD)
    await coll.round()
    busy(node, clock)
    snap = await coll.round()

    lay = node.layout
    for pod in (BE_POD, LS_POD):
        assert {rel for rel, _s, _n in files(coll, pod)} == {lay.pod_dir(pod)}
        assert len(files(coll, pod)) == 3
        assert snap.pods[pod.uid].containers == ()
    assert reader.held == 6  # the two pods' three files: no container file is held open
    opened = {rel for _sub, rel, _name in reader._fds}  # the reader's own cache (BE dir) has none either
    assert not any(rel.startswith((lay.pod_dir(BE_POD), lay.pod_dir(LS_POD))) for rel in opened)
    # the pods themselves are measured as before
    assert close(snap.pods[BE_POD.uid].cpu_usage_cores, 0.9)
    assert close(snap.pods[LS_POD.uid].cpu_usage_cores, 0.45)
    for kind in CONTAINER_KINDS:
        assert store.keys(kind) == []


async def test_cpu_demand_reads_cpu_usage_and_throttling_only(node: SyntheticNode) -> None:
    demand = Demand({LS_POD.uid: ContainerSeries.CPU})
    coll, _bus, store, clock, reader = await setup(node, demand, BE_POD, LS_POD)
    await coll.round()
    busy(node, clock)
    snap = await coll.round()

    cc = node.layout.container_dir(LS_POD, CC)
    ctr_files = sorted(name for rel, _s, name in files(coll, LS_POD) if rel == cc)
    v1 = node.version is CgroupVersion.V1
    assert ctr_files == (["cpu.stat", "cpuacct.usage"] if v1 else ["cpu.stat"])
    assert len(files(coll, BE_POD)) == 3
    assert reader.held == 6 + len(ctr_files)
    (c,) = snap.pods[LS_POD.uid].containers
    assert (c.id, c.name) == (CC, "main")
    assert close(c.cpu_usage_cores, 0.45)
    assert c.throttled_ratio == 0.5
    assert c.memory_working_set is None  # not read: 64 MiB were there
    assert snap.pods[BE_POD.uid].containers == ()
    assert close(store.last(MetricKind.CONTAINER_CPU_USAGE, CC), 0.45)
    assert store.last(MetricKind.CONTAINER_CPU_THROTTLED, CC) == 0.5
    assert store.keys(MetricKind.CONTAINER_MEMORY_USAGE) == []
    assert store.keys(MetricKind.CONTAINER_CPU_USAGE) == [CC]


async def test_memory_demand_reads_the_working_set_only(node: SyntheticNode) -> None:
    demand = Demand({LS_POD.uid: ContainerSeries.MEMORY})
    coll, _bus, _store, clock, _reader = await setup(node, demand, BE_POD, LS_POD)
    await coll.round()
    busy(node, clock)
    snap = await coll.round()
    cc = node.layout.container_dir(LS_POD, CC)
    usage = "memory.usage_in_bytes" if node.version is CgroupVersion.V1 else "memory.current"
    assert sorted(name for rel, _s, name in files(coll, LS_POD) if rel == cc) == sorted(
        [usage, "memory.stat"]
    )
    (c,) = snap.pods[LS_POD.uid].containers
    assert c.memory_working_set == 64 << 20
    assert (c.cpu_usage_cores, c.throttled_ratio) == (None, None)


async def test_without_a_demand_every_container_file_is_read(node: SyntheticNode) -> None:
    """No demand (`--container-metrics=all`, koordlet's behaviour): CPU usage, throttling and memory of every
    started container."""
    coll, _bus, store, clock, _reader = await setup(node, None, BE_POD, LS_POD)
    await coll.round()
    busy(node, clock)
    snap = await coll.round()
    per_container = 4 if node.version is CgroupVersion.V1 else 3
    assert len(files(coll, BE_POD)) == 3 + 2 * per_container
    assert len(files(coll, LS_POD)) == 3 + per_container
    a, b = snap.pods[BE_POD.uid].containers
    assert (a.id, b.id) == (CA, CB)
    assert close(a.cpu_usage_cores, 0.3)
    assert a.throttled_ratio == 0.25
    (c,) = snap.pods[LS_POD.uid].containers
    assert c.memory_working_set == 64 << 20
    assert sorted(store.keys(MetricKind.CONTAINER_MEMORY_USAGE)) == [CA, CB, CC]


async def test_demand_is_asked_again_only_when_the_pod_or_the_nodeslo_changes(node: SyntheticNode) -> None:
    class SloDemand(Demand):
        """CPU for the LS pod while the NodeSLO's CPU burst policy is auto."""

        def __call__(self, pod: PodInfo, state: NodeState) -> ContainerSeries:
            super().__call__(pod, state)
            slo = state.node_slo
            burst = slo.cpu_burst_strategy if slo is not None else None
            wanted = burst is not None and burst.policy == "auto" and pod.uid == LS_POD.uid
            return ContainerSeries.CPU if wanted else ContainerSeries.NONE

    demand = SloDemand()
    coll, bus, _store, clock, reader = await setup(node, demand, BE_POD, LS_POD)
    for _ in range(3):
        busy(node, clock)
        snap = await coll.round()
    assert demand.calls == {BE_POD.uid: 1, LS_POD.uid: 1}
    assert snap.pods[LS_POD.uid].containers == ()
    assert reader.held == 6

    # a NodeSLO arrives: both pods are asked again; the LS container's CPU is read from the next round on
    await bus.publish(NodeSLOUpdated(slo=slo("auto")))
    busy(node, clock)
    snap = await coll.round()
    assert demand.calls == {BE_POD.uid: 2, LS_POD.uid: 2}
    (c,) = snap.pods[LS_POD.uid].containers
    assert c.cpu_usage_cores is None  # the first sample of the counter: no delta yet
    busy(node, clock)
    snap = await coll.round()
    (c,) = snap.pods[LS_POD.uid].containers
    assert close(c.cpu_usage_cores, 0.45)
    assert c.throttled_ratio == 0.5
    held = reader.held
    assert held > 6

    # a new PodInfo for the LS pod: only it is asked again; the same files stay open
    ls2 = PodInfo(
        uid=LS_POD.uid,
        namespace=LS_POD.namespace,
        name=LS_POD.name,
        kube_qos=LS_POD.kube_qos,
        containers=LS_POD.containers,
        labels={"changed": "yes"},
    )
    await bus.publish(PodUpserted(ls2))
    busy(node, clock)
    snap = await coll.round()
    assert demand.calls == {BE_POD.uid: 2, LS_POD.uid: 3}
    assert close(snap.pods[LS_POD.uid].containers[0].cpu_usage_cores, 0.45)  # the counter carried on
    assert reader.held == held

    # the policy is none again: the container files are closed
    await bus.publish(NodeSLOUpdated(slo=slo("none")))
    busy(node, clock)
    snap = await coll.round()
    assert demand.calls == {BE_POD.uid: 3, LS_POD.uid: 4}
    assert snap.pods[LS_POD.uid].containers == ()
    assert reader.held == 6
