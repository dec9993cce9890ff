"""Window statistics as koordlet computes them for the NodeMetric report (docs/reporting.md, "Status fields").

The percentile index rule is koordlet's (`fieldPercentileOfMetricList`): sort ascending and take index
`max(0, floor(n·p) − 1)` — parity with koordlet (docs/reporting.md), kept apart from `MetricStore.percentile`
(nearest rank), which the QoS strategies use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

#: statistic key → percentile (None: arithmetic mean); keys are koordinator's `apis/extension` constants
STATISTICS: Mapping[str, float | None] = MappingProxyType(
    {"avg": None, "p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}
)
#: an aggregated window is "in cold start" when its samples span less than this share of the duration
COLD_START_RATIO = 0.5


def koord_percentile(ordered: Sequence[float], p: float) -> float:
    """The p-quantile (0 < p <= 1) of ascending `ordered` by koordlet's index rule; ValueError when empty."""
    if not ordered:
        raise ValueError("no samples")
    # float arithmetic as in Go's int(float64(n) * p), so borderline products truncate the same way
    return ordered[max(0, int(len(ordered) * p) - 1)]


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean, None for no samples."""
    return sum(values) / len(values) if values else None


def window_statistics(values: Sequence[float]) -> dict[str, float] | None:
    """avg, p50, p90, p95, p99 of a window's samples; None when the window is empty."""
    if not values:
        return None
    ordered = sorted(values)
    out: dict[str, float] = {}
    for key, p in STATISTICS.items():
        out[key] = sum(ordered) / len(ordered) if p is None else koord_percentile(ordered, p)
    return out


def in_cold_start(first: float | None, last: float | None, duration: float) -> bool:
    """koordlet `metricsInColdStart`: the samples found in the window span less than half of it."""
    if first is None or last is None:
        return True
    return (last - first) < COLD_START_RATIO * duration
