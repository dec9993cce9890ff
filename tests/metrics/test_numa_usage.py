"""Per-NUMA usage from the collector to the NodeMetric's numaUsages (docs/prediction.md, "numaUsages"):
per-CPU /proc/stat ticks summed by NUMA node, the node's sysfs meminfo, pods' memory.numa_stat, and the
per-tick system part."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from koordqos.bus import EventBus
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.events.types import PodUpserted
from koordqos.metrics.collector import MetricsCollector
from koordqos.metrics.podplan import numa_anon_of
from koordqos.metrics.procfs import numa_memory_used, parse_cpu_busy, parse_node_meminfo
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricSnapshot, NodeSample, NumaSample, PodSample
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.report.history import NumaSeries, ReportHistory, Series
from koordqos.report.nodemetric import AppMeta, PodMeta, StatusSkipped, build_status, numa_usages
from koordqos.report.policy import CollectPolicy
from koordqos.testing.nodefs import SyntheticNode

from .conftest import COMBOS

Gi = 1 << 30
Mi = 1 << 20
POD = PodInfo(uid="ls-1", namespace="ns", name="ls", kube_qos=KubeQoS.BURSTABLE)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_parsers() -> None:
    stat = "cpu  10 0 10 100 0 0 0\ncpu0 1 2 3 50 9 4 5 0\ncpu1 x\ncpu12 1 0 0 0 0 0 0\nintr 1\n"
    assert parse_cpu_busy(stat) == {0: 1 + 2 + 3 + 4 + 5, 12: 1}
    info = parse_node_meminfo(
        "Node 0 MemTotal:       8388608 kB\nNode 0 MemFree:        4194304 kB\n"
        "Node 0 Active(file):    1048576 kB\nNode 0 Inactive(file):   524288 kB\n"
        "Node 0 SReclaimable:  524288 kB\n"
    )
    assert numa_memory_used(info) == 2 * Gi
    assert numa_memory_used({"MemTotal": 1, "MemFree": 5}) == 0
    assert numa_memory_used({"MemTotal": 1}) is None
    v1 = b"total=9 N0=5 N1=4\nanon=0 N0=0 N1=0\nhierarchical_anon=3 N0=2 N1=1\n"
    v1 += b"hierarchical_unevictable=1 N1=1\n"
    assert numa_anon_of(v1, v2=False, page_size=4096) == {0: 2 * 4096, 1: 2 * 4096}
    v2 = b"anon N0=4096 N1=8192\nfile N0=1 N1=1\nunevictable N0=0 N1=4096\n"
    assert numa_anon_of(v2, v2=True) == {0: 4096, 1: 12288}
    assert numa_anon_of(b"file N0=1\n", v2=True) is None
    assert numa_anon_of(None, v2=True) is None


def two_numa_node(tmp_path: object, version: CgroupVersion, driver: object) -> SyntheticNode:
    node = SyntheticNode(tmp_path, version, driver)  # type: ignore[arg-type]
    node.set_numa(0, [0, 1], {"MemTotal": 8 * Gi, "MemFree": 4 * Gi, "Active(file)": Gi,
                              "Inactive(file)": 512 * Mi, "SReclaimable": 512 * Mi})  # fmt: skip
    node.set_numa(1, [2, 3], {"MemTotal": 8 * Gi, "MemFree": 6 * Gi})
    return node


@pytest.mark.parametrize(("version", "driver"), COMBOS, ids=str)
async def test_collector_to_numa_usages(tmp_path: object, version: CgroupVersion, driver: object) -> None:
    node = two_numa_node(tmp_path, version, driver)
    bus = EventBus()
    pod_dir = node.add_pod(POD)
    await bus.publish(PodUpserted(POD))
    clock = Clock()
    coll = MetricsCollector(
        bus,
        node.layout,
        CgroupReader(node.layout),
        MetricStore(600, 1.0, clock=clock),
        proc_root=node.proc_root,
        sys_root=node.sys_root,
        topology=read_topology(node.sys_root),
        clock=clock,
    )
    v1 = version is CgroupVersion.V1
    # the pod: 1 GiB anonymous on NUMA 0, 512 MiB on NUMA 1
    pages = 4096
    numa_stat = (
        f"hierarchical_anon={(1536 * Mi) // pages} N0={Gi // pages} N1={(512 * Mi) // pages}\n"
        "hierarchical_unevictable=0 N0=0 N1=0\n"
        if v1
        else f"anon N0={Gi} N1={512 * Mi}\nunevictable N0=0 N1=0\n"
    )
    node.write(pod_dir, "memory", "memory.numa_stat", numa_stat)
    node.set_memory(pod_dir, 1536 * Mi, anon=1536 * Mi)
    history = ReportHistory(1.0, clock=clock)
    history.ingest(await coll.round())
    for _ in range(3):
        clock.now += 1.0
        node.advance_cpu(0, 100)
        node.advance_cpu(1, 50)  # NUMA 0: 1.5 cores
        node.advance_cpu(2, 50)  # NUMA 1: 0.5 cores
        node.add_cpu_usage(pod_dir, 400_000_000)  # the pod: 0.4 cores
        snap = await coll.round()
        history.ingest(snap)
    assert [(n.node, n.cpu_usage_cores, n.memory_used) for n in snap.node.numa] == [
        (0, pytest.approx(1.5), 2 * Gi),
        (1, pytest.approx(0.5), 2 * Gi),
    ]
    assert snap.pods[POD.uid].numa_memory == {0: Gi, 1: 512 * Mi}
    status = build_status(history, CollectPolicy(), [PodMeta.of(POD)], [], 0.0)
    assert not isinstance(status, StatusSkipped)
    # system CPU = 2.0 − 0.4 = 1.6 cores, split 3:1 by the NUMA nodes' usage
    assert status["nodeMetric"]["numaUsages"] == [
        {
            "numaNodeID": 0,
            "nodeUsage": {"resources": {"cpu": "1500m", "memory": "2Gi"}},
            "systemUsage": {"resources": {"cpu": "1200m", "memory": "1Gi"}},
        },
        {
            "numaNodeID": 1,
            "nodeUsage": {"resources": {"cpu": "500m", "memory": "2Gi"}},
            "systemUsage": {"resources": {"cpu": "400m", "memory": "1536Mi"}},
        },
    ]


async def test_no_numa_information_no_numa_usages(tmp_path: object) -> None:
    node = SyntheticNode(tmp_path)  # type: ignore[arg-type]
    clock = Clock()
    coll = MetricsCollector(
        EventBus(),
        node.layout,
        CgroupReader(node.layout),
        MetricStore(600, 1.0, clock=clock),
        proc_root=node.proc_root,
        sys_root=node.sys_root,
        topology=read_topology(node.sys_root),
        clock=clock,
    )
    history = ReportHistory(1.0, clock=clock)
    for _ in range(3):
        clock.now += 1.0
        node.advance_node_cpu(100, 100)
        history.ingest(await coll.round())
    status = build_status(history, CollectPolicy(), [], [AppMeta("x")], 0.0)
    assert not isinstance(status, StatusSkipped)
    assert "numaUsages" not in status["nodeMetric"]


def test_the_spec_vector() -> None:
    """koordlet's NUMA usage test vector through the planner, the series as koordlet's test mocks them: NUMA 0
    node 1.5 cores / 1024 B and system 0.5 / 512; NUMA 1 node 2.5 / 2048 and no system CPU sample (so no
    systemUsage)."""
    history = ReportHistory(1.0, clock=lambda: 100.0)

    def series(*values: float) -> Series:
        s = Series(8)
        for v in values:
            s.append(99.0, v)
        return s

    history.numa[0] = NumaSeries(series(1.5), series(1024), series(0.5), series(512))
    history.numa[1] = NumaSeries(series(2.5), series(2048), series(), series(0))
    history.numa[2] = NumaSeries(series(), series(4096), series(), series())  # no CPU samples: left out
    assert numa_usages(history, 0.0, 100.0) == [
        {
            "numaNodeID": 0,
            "nodeUsage": {"resources": {"cpu": "1500m", "memory": "1Ki"}},
            "systemUsage": {"resources": {"cpu": "500m", "memory": "512"}},
        },
        {"numaNodeID": 1, "nodeUsage": {"resources": {"cpu": "2500m", "memory": "2Ki"}}},
    ]


def test_numa_system_memory_per_tick() -> None:
    """One NUMA node: its system memory is its usage minus all pods' anonymous memory of the round."""
    history = ReportHistory(1.0, clock=lambda: 100.0)
    pods = MappingProxyType({"p": PodSample("p", 0.5, Gi, (), Gi // 2)})
    node = NodeSample(cpu_usage_cores=2.0, memory_used=3 * Gi, numa=(NumaSample(0, 2.0, 3 * Gi),))
    history.ingest(MetricSnapshot(0, 1, node, pods), at=99.0)
    n0 = history.numa[0]
    assert n0.system_memory.latest() == (99.0, 2.5 * Gi)
    assert n0.system_cpu.latest() == (99.0, 1.5)
