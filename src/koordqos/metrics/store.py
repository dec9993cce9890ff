"""MetricStore: per-series ring buffers with time retention, and window queries ending now.

A series is (kind, key): key "" for node and BE series, the pod uid for pod series, the container id for
container series, the NodeSLO host application name for host application series. Queries look at samples
with `now − window <= t <= now`; `last` defaults to 2 × collect interval (docs/behaviour-qos-manager.md,
"Metric windows"). Percentiles use the nearest-rank method.

Samples live in `_Ring`s of two `array('d')` columns, not deques of (t, v) tuples: an array holds no Python
objects, so the garbage collector has nothing to walk in it (with tuples, a full collection visited every
sample, 14–17 ms in one step at 1,000 pods), and a sample costs 16 bytes instead of ~90.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Iterable, Iterator

from koordqos.metrics.types import MetricKind, MetricSnapshot, PodSample


class _Ring:
    """One series: (time, value) samples, oldest first, at most `maxlen` of them.

    Two append-only `array('d')` columns and the index of the oldest live sample; the dead prefix is cut off
    once it is as long as the live part, so appending and trimming are amortised O(1) and C-level.
    """

    __slots__ = ("_maxlen", "_start", "_t", "_v")

    def __init__(self, maxlen: int) -> None:
        self._t = array("d")
        self._v = array("d")
        self._start = 0
        self._maxlen = maxlen

    def __len__(self) -> int:
        return len(self._t) - self._start

    def append(self, t: float, v: float) -> None:
        """Add the newest sample; the oldest one goes when there are `maxlen` (as a bounded deque)."""
        self._t.append(t)
        self._v.append(v)
        if len(self._t) - self._start > self._maxlen:
            self._start += 1
            self._compact()

    def trim(self, horizon: float) -> None:
        """Drop samples older than `horizon`."""
        t = self._t
        start = self._start
        n = len(t)
        while start < n and t[start] < horizon:
            start += 1
        if start != self._start:
            self._start = start
            self._compact()

    def _compact(self) -> None:
        start = self._start
        if start >= 32 and start * 2 >= len(self._t):
            del self._t[:start]
            del self._v[:start]
            self._start = 0

    def newest_first(self) -> Iterator[tuple[float, float]]:
        """(t, v) pairs, newest first."""
        t, v = self._t, self._v
        for j in range(len(t) - 1, self._start - 1, -1):
            yield t[j], v[j]


_POD_KINDS = frozenset({MetricKind.POD_CPU_USAGE, MetricKind.POD_MEMORY_USAGE})
_APP_KINDS = (MetricKind.HOST_APP_CPU_USAGE, MetricKind.HOST_APP_MEMORY_USAGE)


class MetricStore:
    """In-memory time series of the agent's metrics (service "metric_store")."""

    def __init__(
        self,
        retention_seconds: float = 600.0,
        collect_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.retention = retention_seconds
        self.collect_interval = collect_interval
        self._clock = clock
        # the bound guards against a fast caller; the time retention is what normally trims
        self._maxlen = math.ceil(retention_seconds / max(collect_interval, 0.001)) * 2 + 16
        self._series: dict[tuple[str, str], _Ring] = {}
        self._pod_of: dict[str, str] = {}  # container id → pod uid
        self._pods: set[str] = set()  # uids with pod or container series
        self._apps: set[str] = set()  # host application names with series

    def __len__(self) -> int:
        return len(self._series)

    # -- writing -------------------------------------------------------------------------------------------

    def add(self, kind: MetricKind | str, key: str, value: float, at: float | None = None) -> None:
        """Append one sample (time `at`, default now) and trim samples older than the retention."""
        t = self._clock() if at is None else at
        s = self._series.get((kind, key))
        if s is None:
            s = self._series[(kind, key)] = _Ring(self._maxlen)
        s.append(t, float(value))
        if kind in _POD_KINDS:
            self._pods.add(key)
        elif kind in _APP_KINDS:
            self._apps.add(key)
        s.trim(t - self.retention)

    def ingest(self, snap: MetricSnapshot) -> None:
        """Store every measured value of a collection round (None values are skipped)."""
        self.ingest_pods(snap.at, snap.pods.items())
        self.ingest_node(snap)

    def ingest_node(self, snap: MetricSnapshot) -> None:
        """The node, BE and host-application part of `ingest` (the pods go through `ingest_pods`)."""
        samples: list[tuple[str, str, float | None]] = [
            (MetricKind.NODE_CPU_USAGE, "", snap.node.cpu_usage_cores),
            (MetricKind.NODE_MEMORY_USAGE, "", snap.node.memory_used),
            (MetricKind.NODE_MEMORY_USAGE_WITH_CACHE, "", snap.node.memory_used_with_cache),
            (MetricKind.BE_CPU_USAGE, "", snap.be.usage_milli),
            (MetricKind.BE_CPU_REQUEST, "", snap.be.request_milli),
            (MetricKind.BE_CPU_REAL_LIMIT, "", snap.be.real_limit_milli),
        ]
        for name, app in snap.host_apps.items():
            self._apps.add(name)
            samples.append((MetricKind.HOST_APP_CPU_USAGE, name, app.cpu_usage_cores))
            samples.append((MetricKind.HOST_APP_MEMORY_USAGE, name, app.memory_working_set))
        self._append(snap.at, samples)

    def ingest_pods(self, at: float, pods: Iterable[tuple[str, PodSample]]) -> None:
        """Store (uid, sample) pod and container samples of a round taken at `at` (a caller with many pods
        feeds them in slices, so no single call holds the event loop long)."""
        pod_of = self._pod_of
        uids = self._pods
        # one tight loop over (kind, key, value): ~8 samples per pod with two containers
        samples: list[tuple[str, str, float | None]] = []
        append = samples.append
        for uid, pod in pods:
            uids.add(uid)
            append((MetricKind.POD_CPU_USAGE, uid, pod.cpu_usage_cores))
            append((MetricKind.POD_MEMORY_USAGE, uid, pod.memory_working_set))
            for c in pod.containers:
                pod_of[c.id] = uid
                append((MetricKind.CONTAINER_CPU_USAGE, c.id, c.cpu_usage_cores))
                append((MetricKind.CONTAINER_MEMORY_USAGE, c.id, c.memory_working_set))
                append((MetricKind.CONTAINER_CPU_THROTTLED, c.id, c.throttled_ratio))
        self._append(at, samples)

    def _append(self, at: float, samples: list[tuple[str, str, float | None]]) -> None:
        horizon = at - self.retention
        series = self._series
        maxlen = self._maxlen
        for kind, key, value in samples:
            if value is None:
                continue
            s = series.get((kind, key))
            if s is None:
                s = series[(kind, key)] = _Ring(maxlen)
            # _Ring.append and .trim inlined: this loop runs ~8 times per pod per round
            t = s._t
            t.append(at)
            s._v.append(value)
            if t[s._start] < horizon or len(t) - s._start > maxlen:
                s.trim(horizon)
                if len(t) - s._start > maxlen:
                    s._start += 1
                    s._compact()

    def drop_pod(self, uid: str) -> None:
        """Forget a deleted pod's series and its containers'."""
        self._pods.discard(uid)
        for kind in (MetricKind.POD_CPU_USAGE, MetricKind.POD_MEMORY_USAGE):
            self._series.pop((kind, uid), None)
        for cid in [c for c, u in self._pod_of.items() if u == uid]:
            del self._pod_of[cid]
            for kind in (
                MetricKind.CONTAINER_CPU_USAGE,
                MetricKind.CONTAINER_MEMORY_USAGE,
                MetricKind.CONTAINER_CPU_THROTTLED,
            ):
                self._series.pop((kind, cid), None)

    def retain_pods(self, uids: Iterable[str]) -> list[str]:
        """Drop the series of every pod not in `uids`; returns the dropped uids."""
        gone = sorted(self._pods.difference(uids))
        for uid in gone:
            self.drop_pod(uid)
        return gone

    def retain_host_apps(self, names: Iterable[str]) -> list[str]:
        """Drop the series of host applications no longer in the NodeSLO; returns the dropped names."""
        if not self._apps:
            return []
        gone = sorted(self._apps.difference(names))
        for name in gone:
            self._apps.discard(name)
            for kind in _APP_KINDS:
                self._series.pop((kind, name), None)
        return gone

    # -- queries -------------------------------------------------------------------------------------------

    def keys(self, kind: MetricKind | str) -> list[str]:
        """Keys (pod uids, container ids, "") that have a series of `kind`."""
        return [k for (kd, k) in self._series if kd == kind]

    def values(self, kind: MetricKind | str, key: str = "", window: float | None = None) -> list[float]:
        """Sample values in `[now − window, now]`, oldest first (window default: 2 × collect interval)."""
        s = self._series.get((kind, key))
        if not s:
            return []
        now = self._clock()
        start = now - (2 * self.collect_interval if window is None else window)
        out: list[float] = []
        for t, v in s.newest_first():
            if t < start:
                break
            if t <= now:
                out.append(v)
        out.reverse()
        return out

    def last(self, kind: MetricKind | str, key: str = "", window: float | None = None) -> float | None:
        """The newest sample in the window (default 2 × collect interval), None if there is none."""
        s = self._series.get((kind, key))
        if not s:
            return None
        now = self._clock()
        start = now - (2 * self.collect_interval if window is None else window)
        for t, v in s.newest_first():
            if t < start:
                return None
            if t <= now:
                return v
        return None

    def avg(self, kind: MetricKind | str, key: str = "", window: float | None = None) -> float | None:
        """Mean over the window, None when it holds no sample."""
        vals = self.values(kind, key, window)
        return sum(vals) / len(vals) if vals else None

    def percentile(
        self, kind: MetricKind | str, key: str = "", p: float = 95.0, window: float | None = None
    ) -> float | None:
        """Nearest-rank p-th percentile (0 < p <= 100) over the window, None when empty."""
        if not 0 < p <= 100:
            raise ValueError(f"percentile {p} not in (0, 100]")
        vals = sorted(self.values(kind, key, window))
        if not vals:
            return None
        rank = max(1, math.ceil(p / 100 * len(vals)))
        return vals[rank - 1]

    def count(self, kind: MetricKind | str, key: str = "", window: float | None = None) -> int:
        """How many samples the window holds."""
        return len(self.values(kind, key, window))
