"""PSIInterference: act on pressure stall information, not on usage (docs/psi.md).

Two rules, cpu and memory, each a ladder (`psi_ladder`): a latency-sensitive pod's (LSE, LSR, LS) or the
node's stall over its threshold for N rounds while BE pods use the resource → tighten BE CPU suppress a step
per round down to its floor (cpu), then a node condition and a `PreferNoSchedule` taint, then evict BE pods
one per round through the evictor (PDB-aware, per-pod back-off); restore after M clean rounds and a
cooldown. Every step is a decision and an Event on the Node; a rule in preview records and changes nothing.

Inputs → pure step → thin apply: `observe` reads the PSI collector's newest round and the metric store,
`psi_ladder.step` decides, `_apply` carries the actions out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog
from prometheus_client import Gauge

from koordqos import observability as obs
from koordqos.config import AgentConfig, PSIRuleSettings
from koordqos.metrics.psi import PSISnapshot
from koordqos.metrics.types import MetricKind
from koordqos.model.pod import PodInfo
from koordqos.model.qos import QoSClass
from koordqos.state import NodeState
from koordqos.strategies.framework import StrategyEnv
from koordqos.strategies.psi_ladder import (
    Action,
    LadderSettings,
    LadderState,
    Observation,
    Room,
    Rung,
    step,
)
from koordqos.strategies.suppressevents import node_reference

log = structlog.get_logger("koordqos.strategies.psi")

NAME = "PSIInterference"
RESOURCES = ("cpu", "memory")
LATENCY_SENSITIVE = frozenset({QoSClass.LSE, QoSClass.LSR, QoSClass.LS})
EVENT_REASON = "PSIInterference"
EVENT_REASON_RESTORED = "PSIInterferenceCleared"
GiB = 1 << 30

RUNG = Gauge(
    "koordqos_psi_rule_rung",
    "Where each PSI interference rule stands: 0 normal, 1 tighten, 2 node marked, 3 evicting",
    ["resource"],
    registry=obs.REGISTRY,
)


def ladder_settings(rule: PSIRuleSettings, resource: str) -> LadderSettings:
    """The pure ladder's settings from the agent config (memory has no tightening rung)."""
    return LadderSettings(
        pod_threshold=rule.pod_threshold,
        node_threshold=rule.node_threshold,
        clear_ratio=rule.clear_ratio,
        trigger_rounds=rule.trigger_rounds,
        clear_rounds=rule.clear_rounds,
        cooldown_seconds=rule.cooldown_seconds,
        tighten_step_percent=rule.tighten_step_percent,
        mark_after_rounds=rule.mark_after_rounds,
        evict_after_rounds=rule.evict_after_rounds,
        tighten=resource == "cpu",
    )


def _worst(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def observe(
    resource: str, snap: PSISnapshot, pods: Mapping[str, PodInfo], be_usage: float | None, be_min: float
) -> Observation:
    """One rule's observation: the worst latency-sensitive pod's "some" stall, the node's, BE's use."""
    pod_stall = _worst(
        stalls[resource].some_ratio
        for uid, stalls in snap.pods.items()
        if resource in stalls and (pod := pods.get(uid)) is not None and pod.qos in LATENCY_SENSITIVE
    )
    node = snap.node.get(resource)
    node_stall = node.some_ratio if node is not None else None
    return Observation(pod_stall, node_stall, be_usage is not None and be_usage >= be_min and be_usage > 0)


def be_usage(resource: str, state: NodeState, env: StrategyEnv) -> float | None:
    """BE pods' use of `resource`: cores (cpu: the besteffort dir's usage) or GiB (memory: working sets)."""
    store = env.store
    if resource == "cpu":
        milli = store.last(MetricKind.BE_CPU_USAGE, "")
        return None if milli is None else milli / 1000
    total = 0.0
    for uid, pod in state.pods.items():
        if pod.qos is QoSClass.BE and not pod.terminated:
            total += store.last(MetricKind.POD_MEMORY_USAGE, uid) or 0.0
    return total / GiB


@dataclass
class _Rule:
    resource: str
    state: LadderState


class PSIInterferenceStrategy:
    """The PSIInterference strategy as the QoS manager runs it."""

    name = NAME

    def __init__(self) -> None:
        self.rules = {r: _Rule(r, LadderState()) for r in RESOURCES}
        self._seen_at: float | None = None
        self._tasks: set[asyncio.Task[bool]] = set()
        # the node mark: what the rules want, and what was last applied (a failed write is retried each round)
        self.mark_wanted = False
        self._mark_applied = False
        self._mark_reason = ""

    def enabled(self, config: AgentConfig) -> bool:
        """Gate PSIInterference (the agent runs the PSI collector for it)."""
        return config.gate(NAME) and config.psi.interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """The PSI rules' period (`psi.interval_seconds`)."""
        return config.psi.interval_seconds

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """One round per new PSI round: observe, step each rule, act."""
        snap = env.psi.last if env.psi is not None else None
        if snap is None:
            env.warn_once(f"{NAME}:no-psi", "PSI interference rules wait for PSI data (gate PSICollector)")
            return
        if snap.at == self._seen_at:
            return  # the same PSI round again: a streak counts rounds, not ticks
        self._seen_at = snap.at
        settings = env.config.psi
        node = state.node
        capacity = node.capacity.get("cpu", 0) if node is not None else 0
        room = Room(env.tightening.suppress_milli, env.tightening.floor_milli, capacity)
        for resource, rule in self.rules.items():
            cfg = getattr(settings, resource)
            if not cfg.enabled:
                if rule.state.rung is not Rung.NORMAL:  # switched off while engaged: restore
                    await self._apply(
                        state, env, rule, cfg, LadderState(), (Action.RESTORE,), "rule disabled"
                    )
                continue
            obs_ = observe(resource, snap, state.pods, be_usage(resource, state, env), cfg.be_min_usage)
            out = step(rule.state, obs_, room, ladder_settings(cfg, resource), env.clock())
            await self._apply(state, env, rule, cfg, out.state, out.actions, out.why)
        await self._sync_mark(env)
        RUNG.labels("cpu").set(int(self.rules["cpu"].state.rung))
        RUNG.labels("memory").set(int(self.rules["memory"].state.rung))

    async def _apply(
        self,
        state: NodeState,
        env: StrategyEnv,
        rule: _Rule,
        cfg: PSIRuleSettings,
        new: LadderState,
        actions: tuple[Action, ...],
        why: str,
    ) -> None:
        old = rule.state
        rule.state = new
        preview = cfg.preview or env.dry_run
        target = f"psi/{rule.resource}"
        reason = f"{rule.resource}: {why}"
        for action in actions:
            if action is Action.TIGHTEN:
                env.decisions.record(
                    NAME, target, "tighten", old.tighten_milli, new.tighten_milli, reason, dry_run=preview
                )
                if not cfg.preview:  # a dry-run plans CPU suppress tightened too: its writes are dry-run
                    env.tightening.milli = self._tightening()
                self._event(state, env, "Warning", EVENT_REASON, reason, preview)
            elif action is Action.MARK:
                env.decisions.record(
                    NAME, "node", "mark", None, env.config.psi.taint_key, reason, dry_run=preview
                )
                if not preview:
                    self.mark_wanted, self._mark_reason = True, reason
                self._event(state, env, "Warning", EVENT_REASON, reason, preview)
            elif action is Action.EVICT:
                await self._evict(state, env, rule.resource, reason, preview)
            elif action is Action.RESTORE:
                env.decisions.record(NAME, target, "restore", int(old.rung), 0, reason, dry_run=preview)
                if not cfg.preview:
                    env.tightening.milli = self._tightening()
                if not preview and not self._marked_by_other(rule):
                    self.mark_wanted, self._mark_reason = False, reason
                self._event(state, env, "Normal", EVENT_REASON_RESTORED, reason, preview)

    async def _sync_mark(self, env: StrategyEnv) -> None:
        """Bring the node's condition and taint to what the rules want (cluster mode; retried until done)."""
        marker = env.node_marker
        if marker is None or self.mark_wanted == self._mark_applied:
            return
        psi = env.config.psi
        if self.mark_wanted:
            ok = await marker.mark(psi.condition_type, psi.taint_key, EVENT_REASON, self._mark_reason)
        else:
            ok = await marker.unmark(
                psi.condition_type, psi.taint_key, EVENT_REASON_RESTORED, self._mark_reason
            )
        if ok:
            self._mark_applied = self.mark_wanted

    def _tightening(self) -> int:
        """The suppress tightening in force: the cpu rule's."""
        return self.rules["cpu"].state.tighten_milli

    def _marked_by_other(self, rule: _Rule) -> bool:
        """Whether another rule still holds the node marked (the mark is shared: cleared by the last one)."""
        return any(r is not rule and r.state.rung >= Rung.MARK for r in self.rules.values())

    async def _evict(
        self, state: NodeState, env: StrategyEnv, resource: str, reason: str, preview: bool
    ) -> None:
        """Evict one BE pod: the lowest priority first, then the biggest user of the resource."""
        candidates = [p for p in state.pods.values() if p.qos is QoSClass.BE and not p.terminated]
        evictor = env.evictor
        if evictor is not None:
            candidates = [p for p in candidates if not evictor.is_evicted(p)]
        if not candidates:
            env.decisions.record(
                NAME, "node", "evict-none", None, None, f"{reason}: no BE pod left", quiet=True
            )
            return
        kind = MetricKind.POD_CPU_USAGE if resource == "cpu" else MetricKind.POD_MEMORY_USAGE
        pod = min(candidates, key=lambda p: (p.priority or 0, -(env.store.last(kind, p.uid) or 0.0), p.uid))
        message = f"evicted by koordqos: {reason}"
        if preview or evictor is None:
            env.decisions.record(NAME, pod.key, "evict", None, resource, message, dry_run=True)
            return
        await evictor.evict(pod, EVENT_REASON, message, NAME)

    def _event(
        self, state: NodeState, env: StrategyEnv, kind: str, reason: str, message: str, preview: bool
    ) -> None:
        recorder, node = env.events, state.node
        if preview or recorder is None or node is None:
            return
        task = asyncio.create_task(
            recorder.record(node_reference(node.name, node.uid), kind, reason, message)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
