"""The agent in-process against a synthetic node and the fake API server: CPU suppress and memory evict.

Node CPU (/proc/stat) and pod cgroup counters are advanced by a driver task at configured rates; the
collector measures them, the strategies act through the real executor (files of the synthetic cgroup tree)
and the real evictor (HTTP eviction subresource of the fake API server).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from koordqos.agent import Agent
from koordqos.config import build_config
from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import GiB, SyntheticNode
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo, make_pod

NODE = "node-1"
CPUS = 16
INTERVAL = 0.1
BE_DIR = "kubepods/besteffort"


@dataclass
class Rates:
    """CPU usage (cores) the counters advance at."""

    pods: dict[str, float] = field(default_factory=dict)  # pod cgroup dir → cores
    system: float = 0.0


class CounterDriver:
    """Advances /proc/stat and pod cpuacct counters by rate × elapsed time right before each collector
    round reads them, so the measured usage equals the configured rate (no sampling aliasing)."""

    def __init__(self, node: SyntheticNode, rates: Rates) -> None:
        self.node = node
        self.rates = rates
        self.last = time.time()
        self.carry_busy = self.carry_idle = 0.0

    def advance(self) -> None:
        now = time.time()
        dt, self.last = now - self.last, now
        busy = sum(self.rates.pods.values()) + self.rates.system
        self.carry_busy += busy * 100 * dt
        self.carry_idle += (CPUS - busy) * 100 * dt
        b, i = int(self.carry_busy), int(self.carry_idle)
        self.carry_busy -= b
        self.carry_idle -= i
        self.node.advance_node_cpu(b, i)
        for rel, cores in self.rates.pods.items():
            self.node.add_cpu_usage(rel, int(cores * 1e9 * dt))

    def attach(self, agent: Agent) -> None:
        collector = agent.parts.collector
        collect = collector.collect

        async def collect_after_advance() -> Any:
            self.advance()
            return await collect()

        collector.collect = collect_after_advance
        # the round is stamped with the instant the counters were advanced to (writing the files takes
        # a few ms on a busy machine, which would otherwise show up as ±10 % rate noise)
        collector._clock = lambda: self.last


@contextlib.asynccontextmanager
async def running_agent(
    tmp_path: Path, server: FakeAPIServer, driver: CounterDriver | None = None, **overrides: Any
) -> AsyncIterator[Agent]:
    """The agent (cgroups, metrics, kube, strategies) against the synthetic node and the fake server."""

    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    tree: dict[str, Any] = {
        "kube": {"kubeconfig": str(kubeconfig), "node_name": NODE},
        "paths": {
            "cgroup_root": str(tmp_path / "node/cgroup"),
            "proc_root": str(tmp_path / "node/proc"),
            "sys_root": str(tmp_path / "node/sys"),
        },
        "metrics": {"collect_interval_seconds": INTERVAL},
        "qos": {
            "cpu_suppress_interval_seconds": INTERVAL,
            "memory_evict_interval_seconds": INTERVAL,
            "memory_evict_cool_time_seconds": 0.3,
        },
        "nri": {"enabled": False},
    }
    tree.update(overrides)
    agent = Agent(
        build_config(tree),
        local_mode=False,
        packages=("metrics", "kube", "strategies"),
    )
    agent.build()
    if driver is not None:
        driver.attach(agent)
    task = asyncio.create_task(agent.run())
    try:
        await wait_until(lambda: agent.ready, timeout=10, message="agent ready")
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def server() -> AsyncIterator[FakeAPIServer]:
    srv = FakeAPIServer()
    await srv.start()
    yield srv
    await srv.stop()


def quota(node: SyntheticNode) -> int:
    return int(node.read(BE_DIR, "cpu", "cpu.cfs_quota_us"))


def rounds(agent: Agent) -> int:
    return int(agent.parts.collector.rounds)


def record_quota_after_rounds(agent: Agent, node: SyntheticNode) -> list[int]:
    """Wrap the CPU-suppress strategy so the BE quota is recorded after each of its rounds."""
    strategy = agent.parts.qos_manager.runners["BECPUSuppress"].strategy
    run_once = strategy.run_once
    seen: list[int] = []

    async def recording(state: Any, env: Any) -> None:
        await run_once(state, env)
        seen.append(quota(node))

    strategy.run_once = recording
    return seen


def suppress_plan(agent: Agent) -> Any:
    return agent.parts.qos_manager.runners["BECPUSuppress"].strategy.last_plan


async def test_cpu_suppress_cfs_quota_follows_ls_usage(tmp_path: Path, server: FakeAPIServer) -> None:
    node = SyntheticNode(tmp_path / "node", cpus=CPUS, memory_total=64 * GiB)
    ls = make_pod("ls", NODE, qos="LS", uid="uid-ls", requests={"cpu": "4"}, limits={"cpu": "8"})
    be = make_pod("be", NODE, qos="BE", uid="uid-be")
    ls_dir, be_dir = node.add_pod(parse_pod(ls)), node.add_pod(parse_pod(be))
    server.upsert("nodes", make_node(NODE, cpu=str(CPUS), memory="64Gi"))
    server.upsert("pods", ls)
    server.upsert("pods", be)
    slo = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressPolicy": "cfsQuota",
            "cpuSuppressThresholdPercent": 65,
        }
    }
    server.upsert("nodeslos", make_nodeslo(NODE, slo))
    rates = Rates({ls_dir: 2.0, be_dir: 1.0})
    async with running_agent(tmp_path, server, CounterDriver(node, rates)) as agent:
        # LS at 2 cores: 16 × 0.65 − 2 = 8.4 cores from an unlimited quota (no step limit from -1)
        await wait_until(lambda: quota(node) != -1, timeout=10, message="first quota")
        await wait_until(
            lambda: abs(quota(node) - 840_000) <= 30_000, timeout=10, message="quota ≈ 8.4 cores"
        )

        # LS rises to 8 cores: within two CPU-suppress rounds (ticks) the quota is 10.4 − 8 = 2.4 cores
        after_round = record_quota_after_rounds(agent, node)
        start = len(after_round)
        rates.pods[ls_dir] = 8.0
        await wait_until(
            lambda: abs(quota(node) - 240_000) <= 30_000, timeout=10, message="quota ≈ 2.4 cores"
        )
        first = next(i for i, q in enumerate(after_round[start:], 1) if abs(q - 240_000) <= 30_000)
        assert first <= 2, after_round[start:]
        plan = suppress_plan(agent)
        assert plan.suppress_milli is not None

        # LS falls to 1 core: BE grows back in steps of at most 10 % of capacity (160000 µs) per round
        before = len(agent.decisions.recent(strategy="BECPUSuppress"))
        low = quota(node)
        rates.pods[ls_dir] = 1.0
        await wait_until(
            lambda: abs(quota(node) - 940_000) <= 30_000, timeout=10, message="quota ≈ 9.4 cores"
        )
        writes = [
            d
            for d in agent.decisions.recent(strategy="BECPUSuppress")[before:]
            if d.target.endswith("cpu.cfs_quota_us") and d.action == "write"
        ]
        values = [int(str(d.new)) for d in writes]
        assert len(values) >= 4  # 240000 → 940000 takes at least five steps of ≤ 160000
        previous = low
        for v in values:
            assert v - previous <= 160_000
            previous = v

        # switch off: quota back to -1 and the full cpuset
        slo["resourceUsedThresholdWithBE"]["enable"] = False
        server.upsert("nodeslos", make_nodeslo(NODE, slo))
        await wait_until(lambda: quota(node) == -1, timeout=10, message="quota recovered")
        await wait_until(
            lambda: node.read(BE_DIR, "cpuset", "cpuset.cpus") == "0-15", timeout=10, message="cpuset"
        )
        assert node.read(be_dir, "cpuset", "cpuset.cpus") == "0-15"


async def test_cpu_suppress_cpuset_policy(tmp_path: Path, server: FakeAPIServer) -> None:
    node = SyntheticNode(tmp_path / "node", cpus=CPUS, memory_total=64 * GiB)
    ls = make_pod("ls", NODE, qos="LS", uid="uid-ls", requests={"cpu": "4"}, limits={"cpu": "8"})
    be = make_pod("be", NODE, qos="BE", uid="uid-be")
    ls_dir, be_dir = node.add_pod(parse_pod(ls)), node.add_pod(parse_pod(be))
    server.upsert("nodes", make_node(NODE, cpu=str(CPUS), memory="64Gi"))
    server.upsert("pods", ls)
    server.upsert("pods", be)
    slo = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cpuset"}}
    server.upsert("nodeslos", make_nodeslo(NODE, slo))
    rates = Rates({ls_dir: 7.0, be_dir: 0.5})
    async with running_agent(tmp_path, server, CounterDriver(node, rates)):
        # 10.4 − 7 = 3.4 cores → 4 CPUs (two hyper-thread pairs)
        await wait_until(
            lambda: node.read(BE_DIR, "cpuset", "cpuset.cpus") == "0-3", timeout=10, message="BE cpuset 0-3"
        )
        assert node.read(be_dir, "cpuset", "cpuset.cpus") == "0-3"
        slo["resourceUsedThresholdWithBE"]["enable"] = False
        server.upsert("nodeslos", make_nodeslo(NODE, slo))
        await wait_until(
            lambda: node.read(BE_DIR, "cpuset", "cpuset.cpus") == "0-15", timeout=10, message="recovered"
        )
        await wait_until(
            lambda: node.read(be_dir, "cpuset", "cpuset.cpus") == "0-15", timeout=10, message="pod recovered"
        )


async def test_cpu_suppress_changes_are_rate_limited_node_events(
    tmp_path: Path, server: FakeAPIServer
) -> None:
    node = SyntheticNode(tmp_path / "node", cpus=CPUS, memory_total=64 * GiB)
    ls = make_pod("ls", NODE, qos="LS", uid="uid-ls", requests={"cpu": "4"}, limits={"cpu": "8"})
    be = make_pod("be", NODE, qos="BE", uid="uid-be")
    ls_dir, be_dir = node.add_pod(parse_pod(ls)), node.add_pod(parse_pod(be))
    server.upsert("nodes", make_node(NODE, cpu=str(CPUS), memory="64Gi"))
    server.upsert("pods", ls)
    server.upsert("pods", be)
    slo = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
    server.upsert("nodeslos", make_nodeslo(NODE, slo))
    rates = Rates({ls_dir: 8.0, be_dir: 1.0})
    async with running_agent(tmp_path, server, CounterDriver(node, rates)) as agent:
        await wait_until(
            lambda: abs(quota(node) - 240_000) <= 30_000, timeout=10, message="quota ≈ 2.4 cores"
        )
        rates.pods[ls_dir] = 1.0  # BE grows back in several writes, all within the minute
        await wait_until(
            lambda: abs(quota(node) - 940_000) <= 30_000, timeout=10, message="quota ≈ 9.4 cores"
        )
        writes = [
            d
            for d in agent.decisions.recent(strategy="BECPUSuppress")
            if d.target.endswith("cpu.cfs_quota_us") and d.action == "write"
        ]
        assert len(writes) >= 5
        slo["resourceUsedThresholdWithBE"]["enable"] = False
        server.upsert("nodeslos", make_nodeslo(NODE, slo))
        await wait_until(lambda: quota(node) == -1, timeout=10, message="quota recovered")
        await wait_until(
            lambda: any(e["reason"] == "BECPURecovered" for e in server.events),
            timeout=10,
            message="the recovery Event",
        )
    suppressed = [e for e in server.events if e["reason"] == "BECPUSuppressed"]
    assert len(suppressed) == 1  # the first change; the later ones were held back (one a minute)
    assert suppressed[0]["involvedObject"]["kind"] == "Node"
    assert suppressed[0]["involvedObject"]["name"] == NODE
    assert suppressed[0]["message"].startswith("best-effort CPU quota -1 → ")
    assert suppressed[0]["type"] == "Normal"


def _memory_node(tmp_path: Path, server: FakeAPIServer) -> SyntheticNode:
    node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=100 * GiB)
    pods = [
        make_pod("be-a", NODE, qos="BE", uid="uid-a", priority=100),
        make_pod("be-b", NODE, qos="BE", uid="uid-b", priority=100),
        make_pod("be-c", NODE, qos="BE", uid="uid-c", priority=120),
        make_pod("ls", NODE, qos="LS", uid="uid-ls", requests={"memory": "1Gi"}, limits={"memory": "40Gi"}),
    ]
    usage = {"be-a": 20 * GiB, "be-b": 5 * GiB, "be-c": 10 * GiB, "ls": 30 * GiB}
    server.upsert("nodes", make_node(NODE, cpu="4", memory="100Gi"))
    for p in pods:
        server.upsert("pods", p)
        node.set_memory(node.add_pod(parse_pod(p)), usage[p["metadata"]["name"]])
    # 95 % used; threshold 70 → lower 68 → release 27 GiB: 20 + 5 (prio 100, larger first) + 10 (prio 120)
    node.set_meminfo(100 * GiB, 5 * GiB, 4 * GiB)
    slo = {"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": 70}}
    server.upsert("nodeslos", make_nodeslo(NODE, slo))
    return node


async def test_memory_evict_through_eviction_api(tmp_path: Path, server: FakeAPIServer) -> None:
    node = _memory_node(tmp_path, server)
    async with running_agent(tmp_path, server, feature_gates={"BEMemoryEvict": True}) as agent:
        await wait_until(lambda: len(server.evictions) >= 3, timeout=10, message="three evictions")
        node.set_meminfo(100 * GiB, 40 * GiB, 39 * GiB)  # the evicted pods' memory is freed
        start = rounds(agent)
        await wait_until(
            lambda: rounds(agent) >= start + 8, timeout=10, message="more rounds"
        )  # > the 0.3 s cool-down
    assert [e["name"] for e in server.evictions] == ["be-a", "be-b", "be-c"]
    assert all(e["status"] == 201 for e in server.evictions)
    assert server.get("pods", "ls") is not None
    reasons = {e.get("reason") for e in server.events}
    assert "evictPodSuccess" in reasons


async def test_memory_evict_dry_run_records_only(tmp_path: Path, server: FakeAPIServer) -> None:
    _memory_node(tmp_path, server)
    async with running_agent(tmp_path, server, feature_gates={"BEMemoryEvict": True}, dry_run=True) as agent:
        await wait_until(
            lambda: len([d for d in agent.decisions.recent() if d.action == "evict"]) >= 3,
            timeout=10,
            message="three recorded evictions",
        )
        start = rounds(agent)
        await wait_until(lambda: rounds(agent) >= start + 8, timeout=10, message="more rounds")
        evicts = [d for d in agent.decisions.recent() if d.action == "evict"]
    assert server.evictions == []
    assert [d.target for d in evicts] == ["default/be-a", "default/be-b", "default/be-c"]
    assert all(d.dry_run for d in evicts)
    assert all("trigger by koordlet feature BEMemoryEvict" in d.reason for d in evicts)
    assert {p for p in ("be-a", "be-b", "be-c") if server.get("pods", p) is not None} == {
        "be-a",
        "be-b",
        "be-c",
    }
