"""koord-manager's Mid-tier formula (`MidResource` plugin) over a NodeMetric status
(docs/prediction.md, "Mid formula").

Used by the standalone mode (`--batch-resource-source=agent`) to set the Node's `kubernetes.io/mid-cpu`
(integer milli-cores) and `kubernetes.io/mid-memory` (bytes) from the agent's own report, and by tests to
check a report the way koord-manager reads it. Pure: all inputs are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from koordqos.model.keys import MID_CPU, MID_MEMORY
from koordqos.model.quantity import to_int, to_milli
from koordqos.report.format import parse_rfc3339

RESOURCES = ("cpu", "memory")
#: classes whose pods are not counted as Prod-allocated (their default priority is not above Mid's)
_NOT_PROD = frozenset({"koord-mid", "koord-batch", "koord-free"})
#: host applications whose usage counts as system usage: priority above Mid's
_HOST_APP_ABOVE_MID = frozenset({"koord-prod"})
_ACTIVE = frozenset({"Running", "Pending"})


@dataclass(frozen=True, slots=True)
class MidStrategy:
    """The colocation strategy fields the plugin reads, with `DefaultColocationStrategy`'s values."""

    mid_cpu_threshold_percent: int = 100
    mid_memory_threshold_percent: int = 100
    mid_unallocated_percent: int = 0
    mid_static_cpu_reserved_percent: int = 0
    mid_static_memory_reserved_percent: int = 0
    mid_reclaim_mode: Literal["dynamic", "static"] = "dynamic"
    degrade_time_minutes: int = 15
    update_time_threshold_seconds: int = 300
    resource_diff_threshold: float = 0.1


@dataclass(frozen=True, slots=True)
class MidNode:
    """The Node's status capacity and allocatable (milli-cores, bytes) and its reservation annotation."""

    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    annotation_reserved: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class MidPod:
    """A pod of the manager's list on this node: class (with defaults), phase, request."""

    priority: str
    phase: str
    request: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class MidResult:
    """mid-cpu (milli-cores) and mid-memory (bytes), and the intermediate values per resource."""

    mid_cpu: int
    mid_memory: int
    detail: Mapping[str, Mapping[str, int]]

    def resources(self) -> dict[str, int]:
        """`{"kubernetes.io/mid-cpu": …, "kubernetes.io/mid-memory": …}`."""
        return {MID_CPU: self.mid_cpu, MID_MEMORY: self.mid_memory}


def _resource_map(value: Any) -> dict[str, int]:
    """A `ResourceMap` → {cpu milli, memory bytes}, only the resources present."""
    res = value.get("resources") if isinstance(value, Mapping) else None
    out: dict[str, int] = {}
    if isinstance(res, Mapping):
        if "cpu" in res:
            out["cpu"] = to_milli(res["cpu"])
        if "memory" in res:
            out["memory"] = to_int(res["memory"])
    return out


def degraded(status: Mapping[str, Any] | None, now: float, strategy: MidStrategy = MidStrategy()) -> bool:
    """Remove the Mid resources: no NodeMetric status, no `updateTime`, or now > updateTime + degrade time.
    A missing or empty `prodReclaimableMetric` is **not** a reason (it is read as 0)."""
    raw = (status or {}).get("updateTime")
    if not raw:
        return True
    try:
        updated = parse_rfc3339(str(raw))
    except ValueError:
        return True
    return now > updated + strategy.degrade_time_minutes * 60


def static_mid(node: MidNode, strategy: MidStrategy) -> MidResult:
    """`midReclaimMode: static`: min(capacity × static %, capacity × threshold %), truncated."""
    cap = {r: node.capacity.get(r, 0) for r in RESOURCES}
    static = {
        "cpu": cap["cpu"] * strategy.mid_static_cpu_reserved_percent // 100,
        "memory": cap["memory"] * strategy.mid_static_memory_reserved_percent // 100,
    }
    limit = _limits(cap, strategy)
    mid = {r: min(static[r], limit[r]) for r in RESOURCES}
    return MidResult(mid["cpu"], mid["memory"], {"static": static, "limit": limit})


def _limits(cap: Mapping[str, int], strategy: MidStrategy) -> dict[str, int]:
    # integer arithmetic: the same as Go's truncated float product for any real node size (< 2^53 / 100)
    return {
        "cpu": cap["cpu"] * strategy.mid_cpu_threshold_percent // 100,
        "memory": cap["memory"] * strategy.mid_memory_threshold_percent // 100,
    }


def calculate(
    node: MidNode,
    pods: Iterable[MidPod],
    status: Mapping[str, Any],
    strategy: MidStrategy = MidStrategy(),
) -> MidResult:
    """The dynamic mode (or static) of docs/prediction.md "Mid formula", per resource in milli-cores /
    bytes."""
    if strategy.mid_reclaim_mode == "static":
        return static_mid(node, strategy)
    cap = {r: node.capacity.get(r, 0) for r in RESOURCES}
    reclaim = _resource_map((status.get("prodReclaimableMetric") or {}).get("resource"))
    reclaimable = {r: reclaim.get(r, 0) for r in RESOURCES}
    node_metric = status.get("nodeMetric") or {}
    system = _resource_map(node_metric.get("systemUsage") if isinstance(node_metric, Mapping) else None)
    sys_used = {r: system.get(r, 0) for r in RESOURCES}
    for app in status.get("hostApplicationMetric") or []:
        if isinstance(app, Mapping) and app.get("priority") in _HOST_APP_ABOVE_MID:
            usage = _resource_map(app.get("usage"))
            for r in RESOURCES:
                sys_used[r] += usage.get(r, 0)
    kubelet = {r: max(cap[r] - node.allocatable.get(r, 0), 0) for r in RESOURCES}
    annotation = node.annotation_reserved or {}
    reserved = {r: max(sys_used[r], kubelet[r], annotation.get(r, 0)) for r in RESOURCES}
    prod_alloc = dict.fromkeys(RESOURCES, 0)
    for pod in pods:
        if pod.priority in _NOT_PROD or pod.phase not in _ACTIVE:
            continue
        for r in RESOURCES:
            prod_alloc[r] += pod.request.get(r, 0)
    unalloc = {r: max(cap[r] - reserved[r] - prod_alloc[r], 0) for r in RESOURCES}
    usage = _resource_map(node_metric.get("nodeUsage") if isinstance(node_metric, Mapping) else None)
    has_usage = all(r in usage for r in RESOURCES)
    unused = {r: cap[r] - usage[r] if has_usage else 0 for r in RESOURCES}
    limit = _limits(cap, strategy)
    mid: dict[str, int] = {}
    for r in RESOURCES:
        a = max(min(reclaimable[r], unused[r]), 0)
        a += unalloc[r] * strategy.mid_unallocated_percent // 100
        mid[r] = min(a, limit[r])
    detail = {
        "reclaimable": reclaimable,
        "systemUsed": sys_used,
        "reserved": reserved,
        "prodAllocated": prod_alloc,
        "unallocated": unalloc,
        "unused": unused,
        "limit": limit,
    }
    return MidResult(mid["cpu"], mid["memory"], detail)
