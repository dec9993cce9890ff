"""koord-manager's batch-resource formula over a NodeMetric status (docs/reporting.md, "Batch formula").

Used two ways: tests feed the agent's own report through it, as koord-manager would, and the opt-in
standalone mode (`--batch-resource-source=agent`) computes the Node's `kubernetes.io/batch-cpu` /
`batch-memory` with it on clusters without koord-manager. Pure: all inputs are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from koordqos.errors import ModelError
from koordqos.model.quantity import to_int, to_milli
from koordqos.report.format import parse_rfc3339

BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"
_LOW_PRIORITIES = frozenset({"koord-batch", "koord-free"})
_HOST_APP_HP = frozenset({"koord-prod", "koord-mid"})

CPUPolicy = Literal["usage", "maxUsageRequest"]
MemoryPolicy = Literal["usage", "request", "maxUsageRequest"]


@dataclass(frozen=True, slots=True)
class BatchStrategy:
    """The colocation strategy fields the formula reads, with `DefaultColocationStrategy` values."""

    cpu_reclaim_threshold_percent: int = 60
    memory_reclaim_threshold_percent: int = 65
    cpu_calculate_policy: CPUPolicy = "usage"
    memory_calculate_policy: MemoryPolicy = "usage"
    batch_cpu_threshold_percent: int | None = None
    batch_memory_threshold_percent: int | None = None
    degrade_time_minutes: int = 15
    update_time_threshold_seconds: int = 300
    resource_diff_threshold: float = 0.1


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """The Node's capacity and reservations (cpu in millicores, memory in bytes)."""

    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    annotation_reserved: Mapping[str, int] = field(default_factory=dict)  # node.koordinator.sh/reservation
    cpu_normalization_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class ManagedPod:
    """A Running/Pending pod of the manager's pod list on this node."""

    namespace: str
    name: str
    priority: str
    qos: str
    request: Mapping[str, int]  # cpu millicores, memory bytes


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The batch allocatable and the intermediate sums (millicores / bytes)."""

    batch_cpu: int
    batch_memory: int
    detail: Mapping[str, Mapping[str, int]]


def _usage(resource_map: Any) -> dict[str, int]:
    res = (resource_map or {}).get("resources") or {} if isinstance(resource_map, Mapping) else {}
    out: dict[str, int] = {}
    if "cpu" in res:
        out["cpu"] = to_milli(res["cpu"])
    if "memory" in res:
        out["memory"] = to_int(res["memory"])
    return out


def degraded(status: Mapping[str, Any] | None, now: float, strategy: BatchStrategy) -> bool:
    """The manager's `isDegradeNeeded`: no `updateTime`, or older than `degradeTimeMinutes`."""
    raw = (status or {}).get("updateTime")
    if not raw:
        return True
    try:
        updated = parse_rfc3339(str(raw))
    except ValueError:
        return True
    return now - updated >= strategy.degrade_time_minutes * 60


def calculate(
    node: NodeCapacity,
    pods: Iterable[ManagedPod],
    status: Mapping[str, Any],
    strategy: BatchStrategy = BatchStrategy(),
) -> BatchResult:
    """The batch formula (docs/reporting.md): `calculateOnNode` + `CalculateBatchResourceByPolicy`; ModelError
    on a malformed status."""
    res = ("cpu", "memory")
    cap = {r: node.capacity.get(r, 0) for r in res}
    percent = {
        "cpu": strategy.cpu_reclaim_threshold_percent,
        "memory": strategy.memory_reclaim_threshold_percent,
    }
    margin = {r: cap[r] * (100 - percent[r]) // 100 for r in res}
    metrics: dict[tuple[str, str], dict[str, int]] = {}
    prios: dict[tuple[str, str], str] = {}
    for entry in status.get("podsMetric") or []:
        if not isinstance(entry, Mapping):
            raise ModelError(f"podsMetric: expected objects, got {entry!r}")
        key = (str(entry.get("namespace", "")), str(entry.get("name", "")))
        metrics[key] = _usage(entry.get("podUsage"))
        prios[key] = str(entry.get("priority", ""))
    hp_request = dict.fromkeys(res, 0)
    hp_used = dict.fromkeys(res, 0)
    hp_max = dict.fromkeys(res, 0)
    listed: set[tuple[str, str]] = set()
    for pod in pods:
        key = (pod.namespace, pod.name)
        listed.add(key)
        if pod.priority in _LOW_PRIORITIES:
            continue
        req = {r: pod.request.get(r, 0) for r in res}
        for r in res:
            hp_request[r] += req[r]
        usage = metrics.get(key)
        if usage is None:
            for r in res:
                hp_used[r] += req[r]
            continue
        use = {r: usage.get(r, 0) for r in res}
        if pod.qos == "LSE":
            hp_used["cpu"] += req["cpu"]
            hp_used["memory"] += use["memory"]
        else:
            for r in res:
                hp_used[r] += use[r]
        for r in res:
            hp_max[r] += max(req[r], use[r])
    for key, usage in metrics.items():  # dangling: reported but not in the pod list
        if key in listed or prios[key] in _LOW_PRIORITIES:
            continue
        for r in res:
            hp_used[r] += usage.get(r, 0)
            hp_max[r] += usage.get(r, 0)
    node_metric = status.get("nodeMetric") or {}
    system = _usage(node_metric.get("systemUsage") if isinstance(node_metric, Mapping) else None)
    system_used = {r: system.get(r, 0) for r in res}
    for app in status.get("hostApplicationMetric") or []:
        if isinstance(app, Mapping) and app.get("priority") in _HOST_APP_HP:
            usage = _usage(app.get("usage"))
            for r in res:
                system_used[r] += usage.get(r, 0)
    kubelet_reserved = {r: max(cap[r] - node.allocatable.get(r, 0), 0) for r in res}
    reserved = {r: max(kubelet_reserved[r], node.annotation_reserved.get(r, 0)) for r in res}
    system_used = {r: max(system_used[r], reserved[r]) for r in res}
    by_usage = {r: max(cap[r] - margin[r] - system_used[r] - hp_used[r], 0) for r in res}
    by_request = {r: max(cap[r] - margin[r] - reserved[r] - hp_request[r], 0) for r in res}
    by_max = {r: max(cap[r] - margin[r] - system_used[r] - hp_max[r], 0) for r in res}
    cpu = by_max["cpu"] if strategy.cpu_calculate_policy == "maxUsageRequest" else by_usage["cpu"]
    memory = {"usage": by_usage, "request": by_request, "maxUsageRequest": by_max}[
        strategy.memory_calculate_policy
    ]["memory"]
    if strategy.batch_cpu_threshold_percent is not None:
        cpu = min(cpu, cap["cpu"] * strategy.batch_cpu_threshold_percent // 100)
    if strategy.batch_memory_threshold_percent is not None:
        memory = min(memory, cap["memory"] * strategy.batch_memory_threshold_percent // 100)
    ratio = node.cpu_normalization_ratio
    if ratio is not None and ratio > 1:
        cpu = int(cpu * ratio)
    detail = {
        "safetyMargin": margin,
        "hpRequest": hp_request,
        "hpUsed": hp_used,
        "hpMaxUsedRequest": hp_max,
        "systemUsed": system_used,
        "nodeReserved": reserved,
        "byUsage": by_usage,
        "byRequest": by_request,
        "byMaxUsageRequest": by_max,
    }
    return BatchResult(cpu, memory, detail)


def needs_sync(
    old: Mapping[str, int] | None,
    new: Mapping[str, int],
    since_last_write: float | None,
    strategy: BatchStrategy = BatchStrategy(),
) -> bool:
    """The manager's `NeedSync`: a value moved by more than `resourceDiffThreshold`, or the last write is
    older than `updateTimeThresholdSeconds` (or there was none)."""
    if old is None or since_last_write is None or since_last_write >= strategy.update_time_threshold_seconds:
        return True
    for name, value in new.items():
        before = old.get(name)
        if before is None:
            return True
        if before == 0:
            if value != 0:
                return True
            continue
        if abs(value - before) / before > strategy.resource_diff_threshold:
            return True
    return False
