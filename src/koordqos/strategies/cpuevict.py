"""CPUEvict (docs/behaviour-qos-manager.md, "CPU evict"): evict pods under CPU pressure, from three triggers
combined into one eviction pass.

* BECPUEvict — BE satisfaction (real limit or batch allocatable ÷ BE request) too low while BE is busy;
* CPUAllocatableEvict — requests of low-priority pods exceed a share of the node's allocatable;
* CPUEvict — node CPU usage above a threshold.
Pure: `plan_cpu_evict` turns (state, metrics, config) into `EvictTask`s; the framework runs the pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog

from koordqos.config import AgentConfig
from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.keys import BATCH_CPU
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO, ResourceThresholdStrategy, is_feature_disabled
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState
from koordqos.strategies.eviction import (
    EXTENDED_RESOURCE_CLASS,
    EvictionOutcome,
    EvictTask,
    PodEvictInfo,
    ReleaseTarget,
    batch_cpu_request,
    evict_task_check,
    request_from_pod,
    request_type_and_value,
    sort_be_pods_for_cpu,
    sort_by_priority,
)
from koordqos.strategies.framework import INVALID_CONFIG, StrategyEnv
from koordqos.strategies.intents import REASON_EVICT_BY_BE_CPU_SATISFACTION
from koordqos.strategies.thresholds import VALIDATORS, cpu_evict_lower

log = structlog.get_logger("koordqos.strategies.evict")

NAME = "CPUEvict"
FEATURES = ("BECPUEvict", "CPUAllocatableEvict", "CPUEvict")  # koordlet's fixed order
DEFAULT_BE_USAGE_THRESHOLD = 90
MIN_ALLOCATABLE_BATCH_MILLI = 1.0  # batch allocatable 0 still yields a satisfaction rate


@dataclass(frozen=True)
class BECPUValues:
    """BE aggregate (milli-CPU): usage, request and limit."""

    usage: float
    request: float
    limit: float


def usage_high_enough(v: BECPUValues, threshold_percent: int) -> bool:
    """Whether BE is busy enough for its satisfaction to matter."""
    if v.limit <= 0:
        return False
    if v.limit < 1000:
        return True
    return v.usage / v.limit >= threshold_percent / 100


def satisfaction_release(request: float, limit: float, lower: int, upper: int) -> int:
    """batch-cpu (milli) to release so that limit/request climbs back to `upper` % when below `lower` %."""
    if request <= 0:
        return 0
    rate = limit / request
    if rate > lower / 100:
        return 0
    gap = upper / 100 - rate
    if gap <= 0:
        return 0
    return int(request * gap)


def be_satisfaction_release(
    avg: BECPUValues, cur: BECPUValues, lower: int, upper: int, usage_threshold: int
) -> int:
    """BECPUEvict release from the window averages and the latest values (0: nothing to do)."""
    if not usage_high_enough(avg, usage_threshold):
        return 0
    avg_release = satisfaction_release(avg.request, avg.limit, lower, upper)
    if avg_release <= 0:
        return 0
    if not usage_high_enough(cur, usage_threshold):
        return 0
    if cur.request == avg.request and cur.limit == avg.limit:
        return avg_release
    cur_release = satisfaction_release(cur.request, cur.limit, lower, upper)
    if cur_release <= 0:
        return 0
    return min(avg_release, cur_release)


def batch_allocatable_limit(node: NodeInfo) -> float:
    """The node's batch-cpu allocatable as a limit: missing/negative → −1, zero → 1."""
    value = node.allocatable.get(BATCH_CPU)
    if value is None or value < 0:
        return -1.0
    if value == 0:
        return MIN_ALLOCATABLE_BATCH_MILLI
    return float(value)


def node_usage_release(capacity_milli: int, used_cores: float, threshold: int, lower: int) -> int:
    """CPUEvict release in milli-CPU: capacity × (usage% − lower%) when usage% ≥ threshold, else 0."""
    usage_pct = int(used_cores * 1000) * 100 // capacity_milli
    if usage_pct < threshold:
        return 0
    return capacity_milli * (usage_pct - lower) // 100


def allocatable_release(
    pods: Sequence[PodInfo], node: NodeInfo, kind: str, threshold: int, lower: int, priority_threshold: int
) -> dict[str, int]:
    """The allocatable ledger (`kind` cpu or memory): per resource, what to release to get below lower %."""
    if threshold < 0:
        return {}
    requested: dict[str, int] = {}
    for pod in pods:
        if pod.priority_value > priority_threshold:
            continue
        name, value = request_type_and_value(pod, kind)
        requested[name] = requested.get(name, 0) + value
    out: dict[str, int] = {}
    for name, req in requested.items():
        alloc = node.allocatable.get(name, 0)
        if alloc == 0:
            if req > 0:
                out[name] = req
            continue
        if kind == "cpu":
            if req / alloc > threshold / 100:
                out[name] = int(req - lower / 100 * alloc)
        elif req / alloc > threshold / 100:
            out[name] = int((req / alloc - lower / 100) * alloc)
    return {k: v for k, v in out.items() if v > 0}


def allocatable_pod_resource(released: Mapping[str, int], kind: str) -> Callable[[PodInfo], dict[str, int]]:
    """Pods of the priority classes whose extended resources are released count their request."""
    classes = {EXTENDED_RESOURCE_CLASS[r] for r in released if r in EXTENDED_RESOURCE_CLASS}

    def func(pod: PodInfo) -> dict[str, int]:
        if pod.priority_class not in classes:
            return {}
        return request_from_pod(pod, kind)

    return func


@dataclass(frozen=True)
class CPUEvictInputs:
    """What one CPU-evict round reads."""

    pods: Sequence[PodInfo]
    node: NodeInfo | None
    slo: NodeSLO | None
    gates: Mapping[str, bool]
    store: MetricStore
    collect_interval: float


def _be_values(store: MetricStore, window: float | None, avg: bool) -> tuple[BECPUValues, int]:
    kinds = (MetricKind.BE_CPU_USAGE, MetricKind.BE_CPU_REQUEST, MetricKind.BE_CPU_REAL_LIMIT)
    vals: list[float] = []
    counts: list[int] = []
    for kind in kinds:
        v = store.avg(kind, "", window) if avg else store.last(kind, "", window)
        vals.append(v if v is not None else 0.0)
        counts.append(store.count(kind, "", window) if v is not None else 0)
    return BECPUValues(usage=vals[0], request=vals[1], limit=vals[2]), min(counts)


def _pod_cpu_cores(store: MetricStore, pods: Sequence[PodInfo]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pod in pods:
        v = store.last(MetricKind.POD_CPU_USAGE, pod.uid)
        if v is not None:
            out[pod.uid] = v
    return out


def be_satisfaction_task(
    inp: CPUEvictInputs, t: ResourceThresholdStrategy, node: NodeInfo
) -> EvictTask | None:
    """Trigger A: release batch-cpu requests of BE pods."""
    interval = inp.collect_interval
    window = max(interval, float(t.cpu_evict_time_window_seconds or 0))
    avg, count = _be_values(inp.store, window, avg=True)
    cur, _ = _be_values(inp.store, None, avg=False)
    if t.cpu_evict_policy == "evictByAllocatable":
        limit = batch_allocatable_limit(node)
        avg = BECPUValues(avg.usage, avg.request, limit)
        cur = BECPUValues(cur.usage, cur.request, limit)
    if count * interval < window // 3:
        return None
    lower = t.cpu_evict_be_satisfaction_lower_percent or 0
    upper = t.cpu_evict_be_satisfaction_upper_percent or 0
    threshold = t.cpu_evict_be_usage_threshold_percent
    release = be_satisfaction_release(
        avg, cur, lower, upper, DEFAULT_BE_USAGE_THRESHOLD if threshold is None else threshold
    )
    if release <= 0:
        return None
    feature = "BECPUEvict"
    infos = sort_be_pods_for_cpu(inp.pods, feature, _pod_cpu_cores(inp.store, inp.pods))
    return EvictTask(
        feature,
        tuple(i.pod for i in infos),
        ReleaseTarget.POD_RESOURCE_REQUEST,
        {BATCH_CPU: release},
        lambda pod: {BATCH_CPU: batch_cpu_request(pod)},
    )


def node_usage_task(inp: CPUEvictInputs, t: ResourceThresholdStrategy, node: NodeInfo) -> EvictTask | None:
    """Trigger B: release node CPU usage down to the lower percent."""
    window = max(inp.collect_interval, float(t.cpu_evict_time_window_seconds or 0))
    used = inp.store.avg(MetricKind.NODE_CPU_USAGE, "", window)
    if used is None:
        return None
    threshold = t.cpu_evict_threshold_percent or 0
    release = node_usage_release(node.capacity.get("cpu", 0), used, threshold, cpu_evict_lower(t))
    if release <= 0:
        return None
    feature = "CPUEvict"
    store = inp.store

    def build(pod: PodInfo, base: PodEvictInfo) -> PodEvictInfo | None:
        v = store.last(MetricKind.POD_CPU_USAGE, pod.uid)
        if v is None:
            return None
        return PodEvictInfo(
            base.pod, base.priority, base.label_priority, base.eviction_priority, milli_cpu_used=int(v * 1000)
        )

    infos = sort_by_priority(
        inp.pods, feature, t.evict_enabled_priority_threshold or 0, build, lambda i: i.milli_cpu_used
    )
    used_by_uid = {i.pod.uid: i.milli_cpu_used for i in infos}
    return EvictTask(
        feature,
        tuple(i.pod for i in infos),
        ReleaseTarget.POD_USED,
        {"cpu": release},
        lambda pod: {"cpu": used_by_uid.get(pod.uid, 0)},
    )


def allocatable_evict_task(
    pods: Sequence[PodInfo],
    node: NodeInfo,
    feature: str,
    resource: str,
    threshold_percent: int,
    lower_percent: int,
    priority_threshold: int,
) -> EvictTask | None:
    """CPU/MemoryAllocatableEvict: release the requests of low-priority pods beyond the allocatable share."""
    release = allocatable_release(pods, node, resource, threshold_percent, lower_percent, priority_threshold)
    if not release:
        return None
    by = "milli_cpu_request" if resource == "cpu" else "memory_request"

    def build(pod: PodInfo, base: PodEvictInfo) -> PodEvictInfo | None:
        _, value = request_type_and_value(pod, resource)
        return PodEvictInfo(
            base.pod, base.priority, base.label_priority, base.eviction_priority, **{by: value}
        )

    infos = sort_by_priority(pods, feature, priority_threshold, build, lambda i: getattr(i, by))
    return EvictTask(
        feature,
        tuple(i.pod for i in infos),
        ReleaseTarget.POD_RESOURCE_REQUEST,
        release,
        allocatable_pod_resource(release, resource),
    )


def allocatable_task(inp: CPUEvictInputs, t: ResourceThresholdStrategy, node: NodeInfo) -> EvictTask | None:
    """Trigger C: release requests of low-priority pods beyond the allocatable share."""
    return allocatable_evict_task(
        inp.pods,
        node,
        "CPUAllocatableEvict",
        "cpu",
        t.cpu_allocatable_evict_threshold_percent or 0,
        t.cpu_allocatable_evict_lower_percent or 0,
        t.allocatable_evict_priority_threshold or 0,
    )


_TRIGGERS = {
    "BECPUEvict": be_satisfaction_task,
    "CPUAllocatableEvict": allocatable_task,
    "CPUEvict": node_usage_task,
}


@dataclass
class EvictPlan:
    """One round's tasks, and why features were skipped (feature → message)."""

    tasks: list[EvictTask]
    skipped: dict[str, str]
    invalid: dict[str, str]


class _EvictInputs(Protocol):
    @property
    def node(self) -> NodeInfo | None: ...
    @property
    def slo(self) -> NodeSLO | None: ...
    @property
    def gates(self) -> Mapping[str, bool]: ...


In = TypeVar("In", bound=_EvictInputs)
Trigger = Callable[[In, ResourceThresholdStrategy, NodeInfo], "EvictTask | None"]


def plan_evict(inp: In, resource: str, triggers: Mapping[str, Trigger[In]], missing_config: str) -> EvictPlan:
    """The eviction tasks of one round, features in `triggers`' (koordlet's fixed) order."""
    plan = EvictPlan([], {}, {})
    node = inp.node
    if node is None or node.capacity.get(resource, 0) <= 0:
        plan.skipped["*"] = f"node or its {resource} capacity unknown"
        return plan
    for feature, trigger in triggers.items():
        if not inp.gates.get(feature, False):
            continue
        disabled, err = is_feature_disabled(inp.slo, feature)
        if err is not None or disabled:
            plan.skipped[feature] = err or "disabled by NodeSLO"
            continue
        t = inp.slo.resource_used_threshold_with_be if inp.slo is not None else None
        invalid = VALIDATORS[feature](t)
        if invalid is not None or t is None:
            plan.invalid[feature] = invalid or missing_config
            continue
        task = trigger(inp, t, node)
        if task is not None:
            plan.tasks.append(task)
    return plan


def plan_cpu_evict(inp: CPUEvictInputs) -> EvictPlan:
    """The CPU eviction tasks of one round, in koordlet's feature order."""
    return plan_evict(inp, "cpu", {f: _TRIGGERS[f] for f in FEATURES}, "ResourceThresholdStrategy not config")


def report_plan(env: StrategyEnv, strategy: str, plan: EvictPlan) -> None:
    """Warn once per invalid feature config (counted every round it blocks the feature)."""
    for feature, message in plan.invalid.items():
        INVALID_CONFIG.labels(feature).inc()
        env.warn_once(
            f"{strategy}:{feature}:{message}",
            "invalid eviction config, feature skipped",
            strategy=strategy,
            feature=feature,
            error=message,
        )


def log_outcome(strategy: str, plan: EvictPlan, outcome: EvictionOutcome) -> None:
    """Per task: satisfied, or what is still missing (koordlet's EvictTaskCheck)."""
    for task in plan.tasks:
        ok, remainder = evict_task_check(task, outcome.released.get(task.target))
        if ok:
            log.info(
                "eviction task satisfied",
                strategy=strategy,
                feature=task.feature,
                to_release=dict(task.to_release),
            )
        else:
            log.warning(
                "eviction task not satisfied",
                strategy=strategy,
                feature=task.feature,
                remainder=remainder,
                candidates=len(task.pods),
            )


class CPUEvictStrategy:
    """The CPUEvict strategy as the QoS manager runs it (20 s cool-down, also from start)."""

    name = NAME

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_evict = clock()
        self.last_plan: EvictPlan | None = None

    def enabled(self, config: AgentConfig) -> bool:
        """Any of BECPUEvict, CPUEvict, CPUAllocatableEvict and a positive interval."""
        return any(config.gate(f) for f in FEATURES) and config.qos.cpu_evict_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--cpu-evict-interval-seconds."""
        return config.qos.cpu_evict_interval_seconds

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Cool-down check, plan the tasks, run the eviction pass."""
        if self.clock() - self.last_evict < env.config.qos.cpu_evict_cool_time_seconds:
            return
        inp = CPUEvictInputs(
            tuple(state.pods.values()),
            state.node,
            state.node_slo,
            env.config.feature_gates,
            env.store,
            env.collect_interval,
        )
        plan = plan_cpu_evict(inp)
        self.last_plan = plan
        report_plan(env, NAME, plan)
        if not plan.tasks:
            return
        outcome = await env.evict(NAME, plan.tasks, REASON_EVICT_BY_BE_CPU_SATISFACTION)
        if outcome.newly_evicted:
            self.last_evict = self.clock()
        log_outcome(NAME, plan, outcome)
