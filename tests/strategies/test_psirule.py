"""The PSIInterference strategy on a synthetic node: the ladder's actions carried out — CPU suppress
tightened (the quota really written lower), the node marked (and retried when that fails), BE pods evicted
lowest priority first, everything restored; preview changes nothing; a PSI round counts once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from koordqos.config import build_config
from koordqos.decisions import DecisionLog
from koordqos.events.types import NodeSLOUpdated, NodeUpdated, PodUpserted
from koordqos.metrics.psi import Pressure, PressureLine, PSISnapshot, Stall
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricKind
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState, reduce
from koordqos.strategies.cpusuppress import CPUSuppressStrategy
from koordqos.strategies.framework import StrategyEnv
from koordqos.strategies.psirule import NAME, PSIInterferenceStrategy
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.strategyenv import strategy_env

LS = PodInfo(uid="ls-1", name="web", kube_qos=KubeQoS.BURSTABLE, labels={"koordinator.sh/qosClass": "LS"})
BE_LOW = PodInfo(
    uid="be-1",
    name="batch-low",
    kube_qos=KubeQoS.BESTEFFORT,
    labels={"koordinator.sh/qosClass": "BE"},
    priority=5000,
)
BE_HIGH = PodInfo(
    uid="be-2",
    name="batch-high",
    kube_qos=KubeQoS.BESTEFFORT,
    labels={"koordinator.sh/qosClass": "BE"},
    priority=7000,
)
FAST = {
    "psi": {
        "cpu": {
            "trigger_rounds": 2,
            "clear_rounds": 2,
            "cooldown_seconds": 10,
            "mark_after_rounds": 1,
            "evict_after_rounds": 1,
            "tighten_step_percent": 25,
        },
        "memory": {"enabled": False},
    },
    "feature_gates": {"PSIInterference": True},
}


@dataclass
class PSI:
    """The PSI collector's newest round, set by the test."""

    last: PSISnapshot | None = None
    t: float = 0.0

    def round(self, ls_stall: float) -> None:
        self.t += 1.0
        line = PressureLine(0.0, 0.0, 0.0, 0)
        stall = Stall(Pressure(line, line), some_ratio=ls_stall, full_ratio=0.0)
        self.last = PSISnapshot(self.t, MappingProxyType({}), MappingProxyType({LS.uid: {"cpu": stall}}))


@dataclass
class Marker:
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail: int = 0

    async def mark(self, condition: str, taint_key: str, reason: str, message: str) -> bool:
        self.calls.append(("mark", taint_key))
        if self.fail:
            self.fail -= 1
            return False
        return True

    async def unmark(self, condition: str, taint_key: str, reason: str, message: str) -> bool:
        self.calls.append(("unmark", taint_key))
        return True


@dataclass
class Evictor:
    evicted: list[str] = field(default_factory=list)

    async def evict(self, pod: PodInfo, reason: str, message: str, strategy: str) -> bool:
        self.evicted.append(pod.name)
        return True

    def is_evicted(self, pod: PodInfo) -> bool:
        return pod.name in self.evicted


@dataclass
class Node:
    fs: SyntheticNode
    env: StrategyEnv
    state: NodeState
    psi: PSI
    marker: Marker
    evictor: Evictor
    now: list[float]
    rule: PSIInterferenceStrategy = field(default_factory=PSIInterferenceStrategy)
    suppress: CPUSuppressStrategy = field(default_factory=CPUSuppressStrategy)

    async def round(self, ls_stall: float, be_cores: float = 1.0) -> None:
        """One second: metrics, CPU suppress, then the PSI rules."""
        self.now[0] += 1.0
        t = self.now[0]
        store = self.env.store
        store.add(MetricKind.NODE_CPU_USAGE, "", 1.5, t)
        store.add(MetricKind.POD_CPU_USAGE, LS.uid, 0.5, t)
        store.add(MetricKind.BE_CPU_USAGE, "", be_cores * 1000, t)
        store.add(MetricKind.POD_CPU_USAGE, BE_LOW.uid, 0.4, t)
        store.add(MetricKind.POD_CPU_USAGE, BE_HIGH.uid, 0.6, t)
        self.psi.round(ls_stall)
        await self.suppress.run_once(self.state, self.env)
        await self.rule.run_once(self.state, self.env)

    def quota(self) -> int:
        return int(self.fs.read(self.fs.layout.qos_dir(KubeQoS.BESTEFFORT), "cpu", "cpu.cfs_quota_us"))


def build(tmp_path: Path, **config: object) -> Node:
    fs = SyntheticNode(tmp_path, cpus=4)
    for pod in (LS, BE_LOW, BE_HIGH):
        fs.add_pod(pod)
    state = reduce(
        NodeState(), NodeUpdated(NodeInfo(name="n", capacity={"cpu": 4000}, allocatable={"cpu": 4000}))
    )
    slo = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressPolicy": "cfsQuota",
            "cpuSuppressThresholdPercent": 65,
        }
    }
    state = reduce(state, NodeSLOUpdated(parse_nodeslo({"spec": slo})))
    for pod in (LS, BE_LOW, BE_HIGH):
        state = reduce(state, PodUpserted(pod))
    now = [1000.0]
    merged = {**FAST, **config}
    env = strategy_env(
        fs.layout,
        DecisionLog(),
        config=build_config(merged),
        store=MetricStore(600, 1.0, clock=lambda: now[0]),
        topology=read_topology(fs.sys_root),
        clock=lambda: now[0],
    )
    psi, marker, evictor = PSI(), Marker(), Evictor()
    env.psi, env.node_marker, env.evictor = psi, marker, evictor
    return Node(fs, env, state, psi, marker, evictor, now)


def actions(node: Node) -> list[str]:
    return [d.action for d in node.env.decisions.recent(strategy=NAME)]


async def test_the_ladder_carried_out_and_restored(tmp_path: Path) -> None:
    n = build(tmp_path)
    await n.round(0.0)
    untightened = n.quota()
    # 4 CPUs × 65 % − LS 0.5 − system 0.5 (1.5 node − 0.5 LS − 0.5 BE pods… as CPU suppress computes it)
    assert untightened > 100_000
    await n.round(0.3)
    await n.round(0.3)  # second bad round: engaged, tightened by 25 % of 4 CPUs = 1000 m
    assert n.env.tightening.milli == 1000
    await n.round(0.3)  # CPU suppress now writes the tightened target (an exact step, no smoothing lag)
    assert n.quota() <= untightened - 90_000, (untightened, n.quota())
    # keep stalling: tighten to the floor, then mark, then evict the lowest-priority BE pod
    for _ in range(6):
        await n.round(0.3)
    assert ("mark", "koordqos.io/interference") in n.marker.calls
    assert n.evictor.evicted[:1] == ["batch-low"]
    assert "tighten" in actions(n)
    assert "mark" in actions(n)
    # the stall goes away: 2 clean rounds and the 10 s cooldown, then everything at once
    for _ in range(12):
        await n.round(0.0)
    assert n.env.tightening.milli == 0
    assert ("unmark", "koordqos.io/interference") in n.marker.calls
    assert "restore" in actions(n)
    for _ in range(8):  # CPU suppress climbs back in its own steps (at most 10 % of the node a round)
        await n.round(0.0)
    assert n.quota() >= untightened - 10_000


async def test_a_failed_mark_is_tried_again_next_round(tmp_path: Path) -> None:
    n = build(tmp_path)
    n.marker.fail = 1
    for _ in range(12):
        await n.round(0.3)
    marks = [c for c in n.marker.calls if c[0] == "mark"]
    assert len(marks) == 2  # failed once, then applied, then left alone


async def test_preview_records_and_changes_nothing(tmp_path: Path) -> None:
    n = build(tmp_path, psi={**FAST["psi"], "cpu": {**FAST["psi"]["cpu"], "preview": True}})  # type: ignore[index]
    await n.round(0.0)
    before = n.quota()
    for _ in range(12):
        await n.round(0.3)
    recorded = n.env.decisions.recent(strategy=NAME)
    assert {d.action for d in recorded} >= {"tighten", "mark", "evict"}
    assert all(d.dry_run for d in recorded)
    assert n.env.tightening.milli == 0
    assert n.marker.calls == []
    assert n.evictor.evicted == []
    assert n.quota() == before


async def test_a_psi_round_counts_once(tmp_path: Path) -> None:
    """The strategy may tick faster than PSI is collected: the same round again is no second bad round."""
    n = build(tmp_path)
    await n.round(0.3)
    for _ in range(5):
        await n.rule.run_once(n.state, n.env)
    assert n.rule.rules["cpu"].state.bad_streak == 1
