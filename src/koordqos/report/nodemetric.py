"""The NodeMetric status planner: (report history, collection policy, known pods and host apps, now) →
the complete `status` to write, or why no status may be written (docs/reporting.md, "Reporting rules the code
refers to").

Pure: reads only its arguments. The status is built whole every round (koordlet replaces it wholesale).
`prodReclaimableMetric` / `prodPeakMetric` come from the prediction hook (`report.prediction`), given the
pods that have usage in this report (docs/prediction.md, "Min predictor"); `numaUsages` from the history's
NUMA series (docs/prediction.md, "numaUsages"). The prediction fields and `numaUsages` are reported (issue
#34, docs/prediction.md).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from koordqos.model.pod import PodInfo
from koordqos.report.format import cpu_quantity, go_duration, memory_quantity, rfc3339
from koordqos.report.history import (
    NODE_CPU,
    NODE_MEMORY,
    NODE_MEMORY_WITH_CACHE,
    SYSTEM_CPU,
    SYSTEM_MEMORY,
    EntitySeries,
    ReportHistory,
    Series,
)
from koordqos.report.policy import CollectPolicy
from koordqos.report.stats import STATISTICS, in_cold_start, mean, window_statistics

Json = dict[str, Any]
_EPSILON = 1e-6
ProdFields = Callable[[Sequence[str]], Generator[None, None, Json]]
"""The prediction hook: the uids of the pods reported with usage → the status's prediction fields."""


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What the report says about a pod besides its usage."""

    uid: str
    namespace: str
    name: str
    priority: str  # koord-prod | koord-mid | koord-batch | koord-free | "" (absent)
    qos: str  # LSE | LSR | LS | BE | SYSTEM

    @classmethod
    def of(cls, pod: PodInfo) -> PodMeta:
        """From the agent's pod view (priority and QoS with koordinator's defaults)."""
        return cls(pod.uid, pod.namespace, pod.name, pod.priority_class.value, pod.qos.value)


@dataclass(frozen=True, slots=True)
class AppMeta:
    """A NodeSLO host application: name, priority and QoS copied from the spec."""

    name: str
    priority: str = ""
    qos: str = ""


@dataclass(frozen=True, slots=True)
class StatusSkipped:
    """No status this round, and why (no fresh updateTime over an empty node window; docs/reporting.md)."""

    reason: str


def resource_map(cpu_cores: float | None, memory_bytes: float | None) -> Json:
    """A `ResourceMap`: `{"resources": {"cpu", "memory"}}`, `{}` unless both values exist."""
    if cpu_cores is None or memory_bytes is None:
        return {}
    # truncated to whole millicores / bytes, as koordlet; the epsilon keeps float noise of a mean
    # (1199.9999999) from losing a unit
    return {
        "resources": {
            "cpu": cpu_quantity(int(cpu_cores * 1000 + _EPSILON)),
            "memory": memory_quantity(int(memory_bytes + _EPSILON)),
        }
    }


def _empty_usage() -> Json:
    return {key: {} for key in STATISTICS}


def _aggregated(cpu: Series, memory: Series, durations: Iterable[float], now: float) -> list[Json]:
    """One `AggregatedUsage` per duration; empty maps while the window is in cold start."""
    out: list[Json] = []
    for d in durations:
        cpu_vals, c_first, c_last = cpu.window(now - d, now)
        mem_vals, m_first, m_last = memory.window(now - d, now)
        usage = _empty_usage()
        if not (in_cold_start(c_first, c_last, d) or in_cold_start(m_first, m_last, d)):
            cs, ms = window_statistics(cpu_vals), window_statistics(mem_vals)
            if cs is not None and ms is not None:
                usage = {key: resource_map(cs[key], ms[key]) for key in STATISTICS}
        out.append({"duration": go_duration(d), "usage": usage})
    return out


def _entity_usage(e: EntitySeries, with_cache: bool, start: float, now: float) -> Json | None:
    cpu = mean(e.cpu.window(start, now)[0])
    mem = mean((e.memory_with_cache if with_cache else e.memory).window(start, now)[0])
    if cpu is None or mem is None:
        return None  # no CPU or no memory sample in the window: skipped, as koordlet does
    return resource_map(cpu, mem)


def numa_usages(history: ReportHistory, start: float, now: float) -> list[Json]:
    """`numaUsages`: per NUMA node (by id) the mean node usage and, when it has samples, the mean system
    usage over the aggregate window; a NUMA node without CPU or memory samples is left out
    (docs/prediction.md, "numaUsages")."""
    out: list[Json] = []
    for node_id in sorted(history.numa):
        n = history.numa[node_id]
        cpu = mean(n.cpu.window(start, now)[0])
        mem = mean(n.memory.window(start, now)[0])
        if cpu is None or mem is None:
            continue
        entry: Json = {"numaNodeID": node_id, "nodeUsage": resource_map(cpu, mem)}
        sys_cpu = mean(n.system_cpu.window(start, now)[0])
        sys_mem = mean(n.system_memory.window(start, now)[0])
        if sys_cpu is not None and sys_mem is not None:
            entry["systemUsage"] = resource_map(sys_cpu, sys_mem)
        out.append(entry)
    return out


#: pods planned per synchronous slice; the reporter yields to the event loop between slices
CHUNK = 25


def build_status(
    history: ReportHistory,
    policy: CollectPolicy,
    pods: Iterable[PodMeta],
    apps: Iterable[AppMeta],
    wall_now: float,
    now: float | None = None,
    prediction: ProdFields | None = None,
) -> Json | StatusSkipped:
    """The `NodeMetricStatus` for this round; `now` is the history's (monotonic) clock, default its own."""
    steps = plan_status(history, policy, pods, apps, wall_now, now, prediction)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: Json | StatusSkipped = done.value
            return result


def plan_status(
    history: ReportHistory,
    policy: CollectPolicy,
    pods: Iterable[PodMeta],
    apps: Iterable[AppMeta],
    wall_now: float,
    now: float | None = None,
    prediction: ProdFields | None = None,
) -> Generator[None, None, Json | StatusSkipped]:
    """`build_status` in slices: yields after every CHUNK pods (the caller may give the loop a turn), returns
    the status. All windows end at the same `now`, so slicing does not change the result."""
    t = history.clock() if now is None else now
    start = t - policy.aggregate_seconds
    node_mem_name = NODE_MEMORY_WITH_CACHE if policy.with_page_cache else NODE_MEMORY
    node_cpu = mean(history.node[NODE_CPU].window(start, t)[0])
    node_mem = mean(history.node[node_mem_name].window(start, t)[0])
    if node_cpu is None or node_mem is None:
        missing = "cpu" if node_cpu is None else "memory"
        return StatusSkipped(f"no node {missing} samples in the last {policy.aggregate_seconds}s")
    system_cpu = mean(history.node[SYSTEM_CPU].window(start, t)[0])
    system_mem = mean(history.node[SYSTEM_MEMORY].window(start, t)[0])
    node_metric: Json = {
        "nodeUsage": resource_map(node_cpu, node_mem),
        "aggregatedNodeUsages": _aggregated(
            history.node[NODE_CPU], history.node[node_mem_name], policy.durations, t
        ),
        "systemUsage": resource_map(system_cpu, system_mem),
        "aggregatedSystemUsages": _aggregated(
            history.node[SYSTEM_CPU], history.node[SYSTEM_MEMORY], policy.durations, t
        ),
    }
    if not policy.durations:  # omitempty lists
        del node_metric["aggregatedNodeUsages"], node_metric["aggregatedSystemUsages"]
    numa = numa_usages(history, start, t)
    if numa:
        node_metric["numaUsages"] = numa
    status: Json = {"updateTime": rfc3339(wall_now), "nodeMetric": node_metric}
    yield
    pod_entries: list[Json] = []
    with_usage: list[str] = []
    for i, meta in enumerate(sorted(pods, key=lambda p: (p.namespace, p.name))):
        if i and i % CHUNK == 0:
            yield
        series = history.pods.get(meta.uid)
        usage = None if series is None else _entity_usage(series, policy.with_page_cache, start, t)
        if usage is None:
            continue
        with_usage.append(meta.uid)
        entry: Json = {"namespace": meta.namespace, "name": meta.name, "podUsage": usage}
        if meta.priority:
            entry["priority"] = meta.priority
        if meta.qos:
            entry["qos"] = meta.qos
        pod_entries.append(entry)
    if pod_entries:
        status["podsMetric"] = pod_entries
    app_entries: list[Json] = []
    for app in sorted(apps, key=lambda a: a.name):
        series = history.apps.get(app.name)
        usage = None if series is None else _entity_usage(series, policy.with_page_cache, start, t)
        if usage is None:
            continue
        entry = {"name": app.name, "usage": usage}
        if app.priority:
            entry["priority"] = app.priority
        if app.qos:
            entry["qos"] = app.qos
        app_entries.append(entry)
    if app_entries:
        status["hostApplicationMetric"] = app_entries
    if prediction is not None:
        status.update((yield from prediction(with_usage)))
    return status
