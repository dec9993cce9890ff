"""MemoryEvict (docs/behaviour-qos-manager.md, "Memory evict"): evict pods when node memory usage (or the
memory allocatable ledger) is too high.

Features in koordlet's order: BEMemoryEvict (BE pods by usage), MemoryAllocatableEvict (ledger),
MemoryEvict (priority-based by usage). Pure: `plan_memory_evict` returns `EvictTask`s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from koordqos.config import AgentConfig
from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO, ResourceThresholdStrategy
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState
from koordqos.strategies.cpuevict import (
    EvictPlan,
    allocatable_evict_task,
    log_outcome,
    plan_evict,
    report_plan,
)
from koordqos.strategies.eviction import (
    EvictTask,
    PodEvictInfo,
    ReleaseTarget,
    sort_be_pods_for_memory,
    sort_by_priority,
)
from koordqos.strategies.framework import StrategyEnv
from koordqos.strategies.intents import REASON_EVICT_BY_NODE_MEMORY_USAGE
from koordqos.strategies.thresholds import memory_evict_lower

NAME = "MemoryEvict"
FEATURES = ("BEMemoryEvict", "MemoryAllocatableEvict", "MemoryEvict")  # koordlet's fixed order


def used_threshold_release(capacity_bytes: int, node_used: float, threshold: int, lower: int) -> int:
    """Bytes to release: capacity × (usage% − lower%) when usage% ≥ threshold, else 0."""
    usage_pct = int(node_used) * 100 // capacity_bytes
    if usage_pct < threshold:
        return 0
    return capacity_bytes * (usage_pct - lower) // 100


@dataclass(frozen=True)
class MemoryEvictInputs:
    """What one memory-evict round reads."""

    pods: Sequence[PodInfo]
    node: NodeInfo | None
    slo: NodeSLO | None
    gates: Mapping[str, bool]
    store: MetricStore


def _pod_memory(store: MetricStore, pods: Sequence[PodInfo]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pod in pods:
        v = store.last(MetricKind.POD_MEMORY_USAGE, pod.uid)
        if v is not None:
            out[pod.uid] = v
    return out


def _used_release(inp: MemoryEvictInputs, t: ResourceThresholdStrategy, node: NodeInfo) -> int:
    used = inp.store.last(MetricKind.NODE_MEMORY_USAGE)
    if used is None:
        return 0
    threshold = t.memory_evict_threshold_percent or 0
    return used_threshold_release(node.capacity.get("memory", 0), used, threshold, memory_evict_lower(t))


def be_memory_task(inp: MemoryEvictInputs, t: ResourceThresholdStrategy, node: NodeInfo) -> EvictTask | None:
    """BEMemoryEvict: BE pods by priority, then usage."""
    release = _used_release(inp, t, node)
    if release <= 0:
        return None
    feature = "BEMemoryEvict"
    usage = _pod_memory(inp.store, inp.pods)
    infos = sort_be_pods_for_memory(inp.pods, feature, usage)
    return EvictTask(
        feature,
        tuple(i.pod for i in infos),
        ReleaseTarget.POD_USED,
        {"memory": release},
        lambda pod: {"memory": int(usage.get(pod.uid, 0.0))},
    )


def memory_used_task(
    inp: MemoryEvictInputs, t: ResourceThresholdStrategy, node: NodeInfo
) -> EvictTask | None:
    """MemoryEvict: eviction-enabled pods up to the priority threshold, lowest priority first."""
    release = _used_release(inp, t, node)
    if release <= 0:
        return None
    feature = "MemoryEvict"
    store = inp.store

    def build(pod: PodInfo, base: PodEvictInfo) -> PodEvictInfo | None:
        v = store.last(MetricKind.POD_MEMORY_USAGE, pod.uid)
        if v is None:
            return None
        # Project decision: bytes, not koordlet's ×1000 (a victim releases its real usage).
        return PodEvictInfo(
            base.pod, base.priority, base.label_priority, base.eviction_priority, memory_used=int(v)
        )

    infos = sort_by_priority(
        inp.pods, feature, t.evict_enabled_priority_threshold or 0, build, lambda i: i.memory_used
    )
    used = {i.pod.uid: i.memory_used for i in infos}
    return EvictTask(
        feature,
        tuple(i.pod for i in infos),
        ReleaseTarget.POD_USED,
        {"memory": release},
        lambda pod: {"memory": used.get(pod.uid, 0)},
    )


def memory_allocatable_task(
    inp: MemoryEvictInputs, t: ResourceThresholdStrategy, node: NodeInfo
) -> EvictTask | None:
    """MemoryAllocatableEvict: the ledger of batch/mid/standard memory requests."""
    return allocatable_evict_task(
        inp.pods,
        node,
        "MemoryAllocatableEvict",
        "memory",
        t.memory_allocatable_evict_threshold_percent or 0,
        t.memory_allocatable_evict_lower_percent or 0,
        t.allocatable_evict_priority_threshold or 0,
    )


_TRIGGERS = {
    "BEMemoryEvict": be_memory_task,
    "MemoryAllocatableEvict": memory_allocatable_task,
    "MemoryEvict": memory_used_task,
}


def plan_memory_evict(inp: MemoryEvictInputs) -> EvictPlan:
    """The memory eviction tasks of one round, in koordlet's feature order."""
    return plan_evict(
        inp, "memory", {f: _TRIGGERS[f] for f in FEATURES}, "resourceThresholdStrategy not config"
    )


class MemoryEvictStrategy:
    """The MemoryEvict strategy as the QoS manager runs it (4 s cool-down after an eviction)."""

    name = NAME

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_evict = float("-inf")
        self.last_plan: EvictPlan | None = None

    def enabled(self, config: AgentConfig) -> bool:
        """Any of BEMemoryEvict, MemoryEvict, MemoryAllocatableEvict and a positive interval."""
        return any(config.gate(f) for f in FEATURES) and config.qos.memory_evict_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--memory-evict-interval-seconds."""
        return config.qos.memory_evict_interval_seconds

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Cool-down check, plan the tasks, run the eviction pass."""
        if self.clock() < self.last_evict + env.config.qos.memory_evict_cool_time_seconds:
            return
        inp = MemoryEvictInputs(
            tuple(state.pods.values()), state.node, state.node_slo, env.config.feature_gates, env.store
        )
        plan = plan_memory_evict(inp)
        self.last_plan = plan
        report_plan(env, NAME, plan)
        if not plan.tasks:
            return
        outcome = await env.evict(NAME, plan.tasks, REASON_EVICT_BY_NODE_MEMORY_USAGE)
        if outcome.newly_evicted:
            self.last_evict = self.clock()
        log_outcome(NAME, plan, outcome)
