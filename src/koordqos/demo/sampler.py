"""What the demo measures, as time series and per-phase figures (pure: no I/O).

Latency samples come from the probes (one per slot: scheduled start → end of the work, µs); CPU usage is
the change of cumulative cgroup CPU time between two readings; the quota is read from the besteffort dir.
Times are seconds since the demo started.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_POINT_SECONDS = 0.05


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100) by nearest rank; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return float(ordered[k])


def window_key(phase: str, round: int) -> str:
    """The latency samples' key of one measured phase of one round."""
    return f"{phase}#{round}"


@dataclass(frozen=True, slots=True)
class Point:
    """One sampling instant."""

    t: float
    phase: str
    ls_cpu: float  # cores, since the previous point
    be_cpu: float
    quota: int  # besteffort cpu.cfs_quota_us (-1 unlimited)
    ls_p50_ms: float | None  # over the latency samples since the previous point
    ls_p99_ms: float | None


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """A CPU-suppress decision as the demo shows it."""

    t: float
    action: str
    target: str
    old: str
    new: str
    reason: str


@dataclass
class PhaseFigures:
    """The figures of one phase."""

    name: str
    title: str
    start: float
    end: float
    latency_samples: int
    ls_p50_ms: float | None
    ls_p99_ms: float | None
    ls_p999_ms: float | None
    ls_max_ms: float | None
    ls_cpu_cores: float
    be_cpu_cores: float
    quota_median: float | None  # over the points; -1 = unlimited
    quota_writes: int
    agent_cpu_cores: float | None  # the agent's own CPU over the phase (None: no agent)
    round: int = 0
    loadavg1: float | None = None  # the 1-minute load average when the phase began

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass
class Recorder:
    """Accumulates points, latency samples and decisions; computes the per-phase figures."""

    points: list[Point] = field(default_factory=list)
    decisions: list[DecisionRow] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)  # window key → ms
    _last: tuple[float, float, float] | None = None  # (t, ls cpu s, be cpu s)
    _window: list[float] = field(default_factory=list)

    def add_latencies(self, key: str, samples_us: Sequence[int]) -> None:
        """Latency samples (µs) since the previous point, of the measured window `key` (e.g.
        `window_key(phase, round)`; "" for samples outside any, which only the points' percentiles show)."""
        ms = [s / 1000 for s in samples_us]
        if key:
            self.latencies.setdefault(key, []).extend(ms)
        self._window.extend(ms)

    def add_point(self, t: float, phase: str, ls_cpu_s: float, be_cpu_s: float, quota: int) -> Point | None:
        """A reading of the cumulative CPU times and the quota; returns the point (None for the first)."""
        last = self._last
        if last is not None and t - last[0] < MIN_POINT_SECONDS:
            return None  # too short to give a rate; the next reading covers this stretch too
        self._last = (t, ls_cpu_s, be_cpu_s)
        if last is None:
            self._window.clear()
            return None
        dt = t - last[0]
        window, self._window = self._window, []
        p50, p99 = percentile(window, 50), percentile(window, 99)
        point = Point(t, phase, (ls_cpu_s - last[1]) / dt, (be_cpu_s - last[2]) / dt, quota, p50, p99)
        self.points.append(point)
        return point

    def add_decision(self, row: DecisionRow) -> None:
        """A decision of the agent."""
        self.decisions.append(row)

    def phase_figures(
        self,
        name: str,
        title: str,
        start: float,
        end: float,
        agent_cpu_s: float | None = None,
        rnd: int = 0,
        loadavg1: float | None = None,
    ) -> PhaseFigures:
        """The figures of the phase `name` measured from `start` to `end` in round `rnd` (its points are
        those labelled `name` in that stretch, its latencies those of `window_key(name, rnd)`)."""
        pts = [p for p in self.points if p.phase == name and start < p.t <= end + 1e-9]
        lat = self.latencies.get(window_key(name, rnd), [])
        span = max(end - start, 1e-9)
        covered = len(pts)
        writes = [
            d
            for d in self.decisions
            if start <= d.t <= end and d.target.endswith(("cfs_quota_us", "cpu.max"))
        ]
        return PhaseFigures(
            name=name,
            title=title,
            start=round(start, 3),
            end=round(end, 3),
            latency_samples=len(lat),
            ls_p50_ms=percentile(lat, 50),
            ls_p99_ms=percentile(lat, 99),
            ls_p999_ms=percentile(lat, 99.9),
            ls_max_ms=max(lat) if lat else None,
            ls_cpu_cores=sum(p.ls_cpu for p in pts) / covered if covered else 0.0,
            be_cpu_cores=sum(p.be_cpu for p in pts) / covered if covered else 0.0,
            quota_median=percentile([float(p.quota) for p in pts], 50),
            quota_writes=len([d for d in writes if d.action == "write"]),
            agent_cpu_cores=None if agent_cpu_s is None else agent_cpu_s / span,
            round=rnd,
            loadavg1=loadavg1,
        )
