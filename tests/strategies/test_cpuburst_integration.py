"""CPU burst end to end on a synthetic node: the real metrics collector reads synthetic /proc and cgroup
counters the test advances, publishes MetricTicks on the bus, and the QoS manager runs CPUBurst on them.

Time is a fake clock advanced one collect interval per round (collector, store, executor and manager share
it), so every round is one strategy tick; each round waits for the bus to drain (bounded by a timeout).
Each test runs with the agent's container demand for `--container-metrics=needed` (the default: the collector
reads the container's CPU files because CPU burst's policy needs them) and `all` (every container file).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koordqos.agent import Services, build_services, container_demand
from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.config import AgentConfig
from koordqos.decisions import DecisionLog
from koordqos.events.types import NodeSLOUpdated, PodsReplaced
from koordqos.metrics.collector import MetricsCollector
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.model.pod import PodInfo
from koordqos.strategies import build_qos_manager
from koordqos.strategies.cpuburst import NAME, CPUBurstStrategy
from koordqos.strategies.framework import QoSManager
from koordqos.testing.nodefs import SyntheticNode

from .cpuburst_builders import ctr, make_pod, make_slo

CPUS = 4
TICKS_PER_ROUND = CPUS * 100  # USER_HZ ticks of all CPUs in one 1 s round
BASE, CEIL = 200_000, 600_000  # 2-core limit, cfsQuotaBurstPercent 300


@dataclass
class Node:
    """The synthetic node with the agent's collector and QoS manager wired in-process."""

    fs: SyntheticNode
    ctx: Services
    collector: MetricsCollector
    manager: QoSManager
    clock: list[float]
    pod: PodInfo
    pod_dir: str

    @property
    def ctr_dir(self) -> str:
        return f"{self.pod_dir}/c1"

    def quota(self, rel: str) -> int:
        return int(self.fs.read(rel, "cpu", "cpu.cfs_quota_us"))

    async def round(self, node_busy_cores: float, throttled: bool = True) -> int:
        """Advance counters by one second of work, collect, let the strategy run; returns the new quota."""
        busy = int(node_busy_cores * 100)
        self.fs.advance_node_cpu(busy, TICKS_PER_ROUND - busy)
        for rel in (self.pod_dir, self.ctr_dir):
            self.fs.add_cpu_usage(rel, 1_500_000_000)  # 1.5 cores
        self.fs.add_throttling(self.ctr_dir, 10, 5 if throttled else 0)
        self.clock[0] += 1.0
        await self.collector.round()
        await self.ctx.bus.drained(timeout=5.0)
        got = self.quota(self.ctr_dir)
        assert self.quota(self.pod_dir) == got  # one container: pod and container move together
        return got


@pytest.fixture(params=["needed", "all"])
async def node(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Node]:
    fs = SyntheticNode(tmp_path, cpus=CPUS, extensions=("cpu.cfs_burst_us",))
    config = AgentConfig.model_validate(
        {
            "paths": {"cgroup_root": fs.cgroup_root, "proc_root": fs.proc_root, "sys_root": fs.sys_root},
            "feature_gates": "BECPUSuppress=false,RdtResctrl=false",  # only CPUBurst acts on this node
            "metrics": {"container_metrics": request.param},
        }
    )
    clock = [1000.0]

    def now() -> float:
        return clock[0]

    base = build_services(config, True, EventBus(), DecisionLog(), {})
    store = MetricStore(600, 1.0, clock=now)
    collector = MetricsCollector(
        base.bus,
        base.layout,
        base.reader,
        store,
        proc_root=fs.proc_root,
        topology=read_topology(fs.sys_root),
        interval=1.0,
        clock=now,
        container_demand=container_demand(config, True),
    )
    # the executor's write cache ages with the fake clock too
    executor = CgroupExecutor(base.layout, base.decisions, clock=now)
    ctx = dataclasses.replace(base, metric_store=store, topology=collector.topology, executor=executor)
    manager = build_qos_manager(
        config=ctx.config,
        bus=ctx.bus,
        decisions=ctx.decisions,
        status=ctx.status,
        layout=ctx.layout,
        reader=ctx.reader,
        executor=ctx.executor,
        host=ctx.host,
        metric_store=ctx.metric_store,
        topology=ctx.topology,
        evictor=None,
    )
    assert isinstance(manager, QoSManager)
    assert list(manager.runners) == [NAME]
    manager.env.clock = now
    manager.subscribe()

    pod = make_pod("ls-pod", [ctr("main", "c1", cpu_limit=2000, cpu_request=1000)], qos="LS")
    pod_dir = fs.add_pod(pod)
    for rel in (pod_dir, f"{pod_dir}/c1"):
        fs.write(rel, "cpu", "cpu.cfs_quota_us", BASE)
    bus_task = asyncio.create_task(ctx.bus.run())
    await ctx.bus.publish(PodsReplaced(pods=(pod,), source="api"))
    await ctx.bus.publish(NodeSLOUpdated(slo=make_slo(policy="auto")))
    try:
        yield Node(fs, ctx, collector, manager, clock, pod, pod_dir)
    finally:
        bus_task.cancel()
        await asyncio.gather(bus_task, return_exceptions=True)


async def test_quota_grows_on_idle_node_then_shrinks_under_load_then_resets(node: Node) -> None:
    # first round: no counter deltas yet → node state unknown, nothing throttled → quota stays at base
    assert await node.round(0.2) == BASE

    # idle node (0.2 of 4 cores busy), throttled container: ×1.2 per tick up to the ceiling
    grown = [BASE]
    while grown[-1] < CEIL:
        grown.append(await node.round(0.2))
        assert grown[-1] == min(int(grown[-2] * 1.2), CEIL), grown
        assert len(grown) < 12, grown
    assert grown == [200000, 240000, 288000, 345600, 414720, 497664, 597196, 600000]
    assert await node.round(0.2) == CEIL  # stays at the ceiling

    # static burst budget landed too: 2 cores × 1000 % × 100000
    assert int(node.fs.read(node.ctr_dir, "cpu", "cpu.cfs_burst_us")) == 2_000_000
    assert int(node.fs.read(node.pod_dir, "cpu", "cpu.cfs_burst_us")) == 2_000_000

    # the shared pool goes over the threshold (3.96 of 4 cores): once the 5 s average crosses 50 %, the quota
    # shrinks ×0.8 per tick back towards the base
    shrunk: list[int] = []
    for _ in range(12):
        shrunk.append(await node.round(3.96))
        if len([q for q in shrunk if q < CEIL]) == 3:
            break
    below = [q for q in shrunk if q < CEIL]
    assert below == [480000, 384000, 307200], shrunk
    strategy = node.manager.runners[NAME].strategy
    assert isinstance(strategy, CPUBurstStrategy)
    assert strategy.last is not None
    assert strategy.last.node_state.value == "overload"

    # policy none: base restored, burst budget back to 0
    await node.ctx.bus.publish(NodeSLOUpdated(slo=make_slo(policy="none")))
    assert await node.round(3.96) == BASE
    assert int(node.fs.read(node.ctr_dir, "cpu", "cpu.cfs_burst_us")) == 0
    assert int(node.fs.read(node.pod_dir, "cpu", "cpu.cfs_burst_us")) == 0

    # every step is a decision with its reason and node state
    decisions = node.ctx.decisions.recent(strategy=NAME)
    ctr_quota = [
        d for d in decisions if d.action == "write" and d.target == f"{node.ctr_dir}/cpu.cfs_quota_us"
    ]
    reasons = [d.reason.split(":")[0] for d in ctr_quota]
    assert reasons == ["scaleUp"] * 7 + ["scaleDown"] * 3 + ["reset"]
    assert all("node idle" in d.reason for d in ctr_quota[:7])
    assert all("node overload" in d.reason for d in ctr_quota[7:])
    states = [d.new for d in decisions if d.action == "node-state"]
    assert states[0] == "unknown"
    assert states[1] == "idle"
    assert states[-1] == "overload"


async def test_the_collector_reads_what_the_burst_policy_needs(node: Node) -> None:
    """`needed`: the container's CPU files while the policy bursts the quota, none of its memory files, and
    only the pod's files once the policy is none; `all`: every file all along."""
    await node.round(0.2)
    await node.round(0.2)
    ctr_files = sorted(
        name for rel, _sub, name in node.collector._plans[node.pod.uid].files.entries if rel == node.ctr_dir
    )
    needed = node.collector.container_demand is not None
    every = ["cpu.stat", "cpuacct.usage", "memory.stat", "memory.usage_in_bytes"]
    assert ctr_files == (["cpu.stat", "cpuacct.usage"] if needed else every)
    sample = node.collector.last.pods[node.pod.uid] if node.collector.last else None
    assert sample is not None
    (c,) = sample.containers
    assert c.cpu_usage_cores is not None
    assert abs(c.cpu_usage_cores - 1.5) < 0.01
    assert c.throttled_ratio == 0.5
    assert (c.memory_working_set is None) is needed

    await node.ctx.bus.publish(NodeSLOUpdated(slo=make_slo(policy="none")))
    await node.round(0.2)
    entries = node.collector._plans[node.pod.uid].files.entries
    assert any(rel == node.ctr_dir for rel, _sub, _name in entries) is not needed
    assert node.collector.last is not None
    assert (node.collector.last.pods[node.pod.uid].containers == ()) is needed
