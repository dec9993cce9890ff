"""The NodeMetric `spec.metricCollectPolicy`, merged over koordlet's defaults (koordinator-reporting.md §1.2).

Absent fields keep their default; a present `durations` list replaces the default list; the aggregate
window is raised to at least 60 s and the report interval to at least 30 s. A malformed field keeps its
default and is reported in `problems` (logged once by the reporter), so a bad spec never stops reporting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True, slots=True)
class CollectPolicy:
    """The effective collection policy."""

    aggregate_seconds: int = DEFAULT_AGGREGATE_SECONDS
    report_interval_seconds: int = DEFAULT_REPORT_INTERVAL_SECONDS
    durations: tuple[float, ...] = DEFAULT_DURATIONS
    memory_policy: str = USAGE_WITHOUT_PAGE_CACHE  # as received (reported definition: `with_page_cache`)
    problems: tuple[str, ...] = field(default=(), compare=False)

    @property
    def with_page_cache(self) -> bool:
        """Report memory including page cache; hot-page and unknown policies fall back (PD-3)."""
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


def _int(raw: Any, name: str, default: int, problems: list[str]) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != int(raw):
        problems.append(f"{name}: expected an integer, got {raw!r}")
        return default
    return int(raw)


def parse_collect_policy(spec: Mapping[str, Any] | None) -> CollectPolicy:
    """NodeMetric `spec` (the whole spec object) → effective policy."""
    problems: list[str] = []
    raw = (spec or {}).get("metricCollectPolicy") if isinstance(spec, Mapping) else None
    if raw is None:
        return CollectPolicy()
    if not isinstance(raw, Mapping):
        return CollectPolicy(problems=(f"metricCollectPolicy: expected an object, got {raw!r}",))
    aggregate = _int(
        raw.get("aggregateDurationSeconds"), "aggregateDurationSeconds", DEFAULT_AGGREGATE_SECONDS, problems
    )
    interval = _int(
        raw.get("reportIntervalSeconds"), "reportIntervalSeconds", DEFAULT_REPORT_INTERVAL_SECONDS, problems
    )
    durations: tuple[float, ...] = DEFAULT_DURATIONS
    agg = raw.get("nodeAggregatePolicy")
    if isinstance(agg, Mapping) and agg.get("durations") is not None:
        items = agg.get("durations")
        parsed: list[float] = []
        if not isinstance(items, list):
            problems.append(f"nodeAggregatePolicy.durations: expected a list, got {items!r}")
        else:
            for item in items:
                try:
                    seconds = parse_go_duration(str(item))
                except ValueError:
                    problems.append(f"nodeAggregatePolicy.durations: invalid duration {item!r}")
                    continue
                if seconds <= 0:
                    problems.append(f"nodeAggregatePolicy.durations: duration must be > 0, got {item!r}")
                    continue
                parsed.append(seconds)
            durations = tuple(parsed)
    elif agg is not None and not isinstance(agg, Mapping):
        problems.append(f"nodeAggregatePolicy: expected an object, got {agg!r}")
    memory = raw.get("nodeMemoryCollectPolicy")
    if memory is None:
        memory = USAGE_WITHOUT_PAGE_CACHE
    elif memory not in MEMORY_POLICIES:
        problems.append(
            f"nodeMemoryCollectPolicy: unknown value {memory!r}, using {USAGE_WITHOUT_PAGE_CACHE}"
        )
    return CollectPolicy(
        aggregate_seconds=max(aggregate, MIN_AGGREGATE_SECONDS),
        report_interval_seconds=max(interval, MIN_REPORT_INTERVAL_SECONDS),
        durations=durations,
        memory_policy=str(memory),
        problems=tuple(problems),
    )
