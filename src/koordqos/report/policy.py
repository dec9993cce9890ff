"""The NodeMetric `spec.metricCollectPolicy`, merged over koordlet's defaults (docs/reporting.md, "Collection
policy").

Absent fields keep their default; a present `durations` list replaces the default list; the aggregate
window is raised to at least 60 s and the report interval to at least 30 s.

Each field is checked as the NodeMetric CRD and Go's decoding would (issue #39): the seconds fields are
integers from 0 to the longest Go duration (NaN, ±Inf, fractions, negative, larger or other types are
rejected), `durations` a list of Go duration strings, each > 0 and no longer than a Go duration,
`nodeMemoryCollectPolicy` one of its three values. A rejected field keeps its value of the last policy (the
last valid value) or its default, and is a `FieldProblem` in `problems` (logged and counted by the
reporter), so a hostile spec never stops reporting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from koordqos.model.wirevalue import MAX_DURATION_SECONDS, FieldProblem, json_integer, short
from koordqos.report.format import parse_go_duration

USAGE_WITHOUT_PAGE_CACHE = "usageWithoutPageCache"
USAGE_WITH_HOT_PAGE_CACHE = "usageWithHotPageCache"
USAGE_WITH_PAGE_CACHE = "usageWithPageCache"
MEMORY_POLICIES = (USAGE_WITHOUT_PAGE_CACHE, USAGE_WITH_HOT_PAGE_CACHE, USAGE_WITH_PAGE_CACHE)

DEFAULT_AGGREGATE_SECONDS = 300
DEFAULT_REPORT_INTERVAL_SECONDS = 60
DEFAULT_DURATIONS = (300.0, 600.0, 1800.0)
MIN_AGGREGATE_SECONDS = 60
MIN_REPORT_INTERVAL_SECONDS = 30
#: koord-scheduler's default NodeMetric expiry: a longer report interval makes the metric look stale
SCHEDULER_EXPIRY_SECONDS = 180
_PREFIX = "spec.metricCollectPolicy"


@dataclass(frozen=True, slots=True)
class CollectPolicy:
    """The effective collection policy."""

    aggregate_seconds: int = DEFAULT_AGGREGATE_SECONDS
    report_interval_seconds: int = DEFAULT_REPORT_INTERVAL_SECONDS
    durations: tuple[float, ...] = DEFAULT_DURATIONS
    memory_policy: str = USAGE_WITHOUT_PAGE_CACHE  # as received (reported definition: `with_page_cache`)
    problems: tuple[FieldProblem, ...] = field(default=(), compare=False)

    @property
    def with_page_cache(self) -> bool:
        """Report memory including page cache; hot-page and unknown policies fall back (docs/reporting.md)."""
        return self.memory_policy == USAGE_WITH_PAGE_CACHE

    @property
    def node_retention(self) -> float:
        """How long node/system series must be kept: the longest duration plus one report interval."""
        longest = max((*self.durations, float(self.aggregate_seconds)), default=0.0)
        return longest + self.report_interval_seconds

    @property
    def pod_retention(self) -> float:
        """How long pod/host-app series must be kept: the aggregate window plus one report interval."""
        return float(self.aggregate_seconds + self.report_interval_seconds)


def _seconds(raw: Any, name: str, minimum: int, last: int, problems: list[FieldProblem]) -> int:
    checked = json_integer(raw, f"{_PREFIX}.{name}", 0, MAX_DURATION_SECONDS)
    if isinstance(checked, FieldProblem):
        problems.append(checked)
        return last
    return max(checked, minimum)


def _durations(raw: Any, last: tuple[float, ...], problems: list[FieldProblem]) -> tuple[float, ...]:
    """A list of Go duration strings; any invalid item keeps the whole last valid list (it is one field)."""
    path = f"{_PREFIX}.nodeAggregatePolicy.durations"
    if not isinstance(raw, list):
        problems.append(FieldProblem(path, "wrong type", short(raw), "a list of Go durations"))
        return last
    parsed: list[float] = []
    found: list[FieldProblem] = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(item, str):
            found.append(FieldProblem(where, "wrong type", short(item), 'a Go duration such as "5m0s"'))
            continue
        try:
            seconds = parse_go_duration(item)
        except ValueError:
            found.append(FieldProblem(where, "invalid duration", short(item), 'a Go duration such as "5m0s"'))
            continue
        if not 0 < seconds <= MAX_DURATION_SECONDS:
            found.append(
                FieldProblem(where, "out of range", short(item), f"> 0 and <= {MAX_DURATION_SECONDS}s")
            )
            continue
        parsed.append(seconds)
    if found:
        problems.extend(found)
        return last
    return tuple(parsed)


def parse_collect_policy(spec: Mapping[str, Any] | None, last: CollectPolicy | None = None) -> CollectPolicy:
    """NodeMetric `spec` (the whole spec object) → effective policy; a rejected field keeps its value of
    `last` (the policy in force) or its default."""
    fallback = last if last is not None else CollectPolicy()
    problems: list[FieldProblem] = []
    raw = spec.get("metricCollectPolicy") if isinstance(spec, Mapping) else None
    if raw is None:
        return CollectPolicy()
    if not isinstance(raw, Mapping):
        problem = FieldProblem(_PREFIX, "wrong type", short(raw), "an object")
        return CollectPolicy(
            fallback.aggregate_seconds,
            fallback.report_interval_seconds,
            fallback.durations,
            fallback.memory_policy,
            (problem,),
        )
    aggregate = DEFAULT_AGGREGATE_SECONDS
    if raw.get("aggregateDurationSeconds") is not None:
        aggregate = _seconds(
            raw["aggregateDurationSeconds"],
            "aggregateDurationSeconds",
            MIN_AGGREGATE_SECONDS,
            fallback.aggregate_seconds,
            problems,
        )
    interval = DEFAULT_REPORT_INTERVAL_SECONDS
    if raw.get("reportIntervalSeconds") is not None:
        interval = _seconds(
            raw["reportIntervalSeconds"],
            "reportIntervalSeconds",
            MIN_REPORT_INTERVAL_SECONDS,
            fallback.report_interval_seconds,
            problems,
        )
    durations: tuple[float, ...] = DEFAULT_DURATIONS
    agg = raw.get("nodeAggregatePolicy")
    if isinstance(agg, Mapping):
        if agg.get("durations") is not None:
            durations = _durations(agg["durations"], fallback.durations, problems)
    elif agg is not None:
        path = f"{_PREFIX}.nodeAggregatePolicy"
        problems.append(FieldProblem(path, "wrong type", short(agg), "an object"))
        durations = fallback.durations
    memory = raw.get("nodeMemoryCollectPolicy")
    if memory is None:
        memory = USAGE_WITHOUT_PAGE_CACHE
    elif not isinstance(memory, str) or memory not in MEMORY_POLICIES:
        valid = "one of " + " or ".join(f'"{m}"' for m in MEMORY_POLICIES)
        problems.append(
            FieldProblem(f"{_PREFIX}.nodeMemoryCollectPolicy", "unknown value", short(memory), valid)
        )
        memory = fallback.memory_policy
    return CollectPolicy(
        aggregate_seconds=aggregate,
        report_interval_seconds=interval,
        durations=durations,
        memory_policy=memory,
        problems=tuple(problems),
    )
