"""The QoS manager: registry order, enablement, interval gating, failure isolation, dry-run, flags."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from koordqos.bus import EventBus
from koordqos.config import AgentConfig, build_config
from koordqos.configload import add_flags, load_config
from koordqos.decisions import DecisionLog
from koordqos.events.types import MetricTick
from koordqos.features import DEFAULT_GATES
from koordqos.state import NodeState
from koordqos.strategies.framework import QoSManager, QoSStrategy, StrategyEnv
from koordqos.strategies.intents import CFS_QUOTA
from koordqos.strategies.registry import ORDER, build_all, registered
from koordqos.testing.strategyenv import strategy_env


class Fake:
    """A strategy whose rounds are counted; `fail` makes them raise."""

    def __init__(self, name: str, interval: float = 0.0, fail: bool = False) -> None:
        self.name = name
        self._interval = interval
        self.fail = fail
        self.rounds = 0

    def enabled(self, config: AgentConfig) -> bool:
        return True

    def interval(self, config: AgentConfig) -> float:
        return self._interval

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        self.rounds += 1
        if self.fail:
            raise RuntimeError("boom")


def ctx(base: Path, tree: dict[str, Any] | None = None) -> Any:
    """What QoSManager is wired with: a bus and a StrategyEnv over a synthetic node."""
    from koordqos.testing.nodefs import SyntheticNode

    cfg = build_config(tree or {})
    decisions = DecisionLog(dry_run=cfg.dry_run)
    env = strategy_env(SyntheticNode(base / "node", cpus=4).layout, decisions, config=cfg)
    return SimpleNamespace(config=cfg, bus=EventBus(), decisions=decisions, env=env)


def manager_of(c: Any, strategies: Sequence[QoSStrategy]) -> QoSManager:
    return QoSManager(c.env, c.bus, strategies)


def test_registry_order_and_default_enablement(tmp_path: Path) -> None:
    names = registered()
    assert names == [n for n in ORDER if n in names]
    assert {"BECPUSuppress", "CPUEvict", "MemoryEvict"} <= set(names)
    manager = manager_of(ctx(tmp_path), build_all())
    assert isinstance(manager, QoSManager)
    assert "BECPUSuppress" in manager.runners  # BECPUSuppress is on by default
    assert {"CPUEvict", "MemoryEvict"} <= set(manager.disabled)  # eviction gates are off by default


def test_every_strategy_is_named_by_its_koordlet_gate() -> None:
    """#32 6: logs, decisions and metrics call a strategy by its gate (`BECPUSuppress`, not `CPUSuppress`);
    the eviction strategies serve three gates each and carry the one of their name."""
    names = [s.name for s in build_all()]
    assert names == [
        "BlkIOReconcile",
        "CgroupReconcile",
        "CPUBurst",
        "CPUEvict",
        "BECPUSuppress",
        "MemoryEvict",
        "RdtResctrl",
        "SystemConfig",
        "TCNetworkQoS",
        "TerwayQoS",
        "PSIInterference",
    ]
    assert set(names) <= set(DEFAULT_GATES)


def test_zero_interval_disables_even_with_gate_on(tmp_path: Path) -> None:
    manager = manager_of(ctx(tmp_path, {"qos": {"cpu_suppress_interval_seconds": 0}}), build_all())
    assert isinstance(manager, QoSManager)
    assert "BECPUSuppress" in manager.disabled


async def test_failing_strategy_is_isolated_and_counted(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    bad, good = Fake("Bad", fail=True), Fake("Good")
    manager = manager_of(c, [bad, good])
    state = NodeState()
    for _ in range(3):
        for runner in manager.runners.values():
            await manager.tick(runner, state)
    assert bad.rounds == 3
    assert good.rounds == 3
    assert manager.runners["Bad"].failures == 3
    assert manager.runners["Good"].failures == 0


async def test_interval_gates_rounds(tmp_path: Path) -> None:
    c = ctx(tmp_path, {"metrics": {"collect_interval_seconds": 1.0}})
    slow = Fake("Slow", interval=5.0)
    manager = manager_of(c, [slow])
    now = [100.0]
    manager.env.clock = lambda: now[0]
    runner = manager.runners["Slow"]
    for t in (100.0, 101.0, 104.0, 104.6, 105.0, 109.6):
        now[0] = t
        await manager.tick(runner, NodeState())
    assert slow.rounds == 3  # at 100, 104.6 (5 s minus half a collect interval), 109.6


async def test_subscriptions_run_rounds_on_ticks(tmp_path: Path) -> None:
    import asyncio

    c = ctx(tmp_path)
    fake = Fake("Fake")
    manager = manager_of(c, [fake])
    manager.subscribe()
    bus_task = asyncio.create_task(c.bus.run())
    try:
        await c.bus.publish(MetricTick(at=1.0))
        await c.bus.drained()
    finally:
        bus_task.cancel()
    assert fake.rounds == 1


async def test_dry_run_writes_nothing_and_records(tmp_path: Path) -> None:
    from koordqos.cgroups import CgroupWrite, Level
    from koordqos.testing.nodefs import SyntheticNode

    node = SyntheticNode(tmp_path, cpus=4)
    c = ctx(tmp_path, {"dry_run": True})
    env = strategy_env(node.layout, c.decisions, config=c.config)
    write = CgroupWrite(
        "kubepods/besteffort",
        CFS_QUOTA,
        "200000",
        Level.QOS,
        cacheable=False,
        reason="AdjustBEByNodeCPUUsage",
    )
    await env.apply("BECPUSuppress", [write])
    assert node.read("kubepods/besteffort", "cpu", "cpu.cfs_quota_us") == "-1"
    [d] = c.decisions.recent(strategy="BECPUSuppress")
    assert d.dry_run
    assert d.new in ("200000", 200000)
    assert d.reason == "AdjustBEByNodeCPUUsage"


def test_qos_flags() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(
        [
            "--reconcile-interval-seconds=2",
            "--cpu-suppress-interval-seconds=2",
            "--cpu-evict-interval-seconds=2",
            "--memory-evict-interval-seconds=2",
            "--memory-evict-cool-time-seconds=8",
            "--cpu-evict-cool-time-seconds=40",
        ]
    )
    q = load_config(args, env={}).qos
    assert (
        q.reconcile_interval_seconds,
        q.cpu_suppress_interval_seconds,
        q.cpu_evict_interval_seconds,
        q.memory_evict_interval_seconds,
        q.memory_evict_cool_time_seconds,
        q.cpu_evict_cool_time_seconds,
    ) == (2, 2, 2, 2, 8, 40)
