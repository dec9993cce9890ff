"""ReportHistory: the samples the NodeMetric report is computed from, at bounded memory.

Separate from the QoS strategies' `MetricStore` because the report needs other definitions (pod memory as
anonymous pages, docs/reporting.md; per-tick system usage, docs/reporting.md "System usage per tick") and
other retentions (node and system series for the longest aggregated duration, 30 min by default; pod and
host-app series for the aggregate window, 5 min).

Every series is a fixed-capacity ring of (monotonic time, value) in two `array('d')`s: 16 bytes a point, no
per-sample objects. A series never holds more than `max_points`; when a retention would need more at the
collect interval, consecutive samples are averaged `stride` at a time (exact for means, a smoothing for
percentiles; with the defaults — 1 s, 30 min + 1 interval — no stride is needed). Memory at 200 pods,
defaults: 200 pods × 3 series × ~400 points × 16 B ≈ 4 MB, plus 5 node series × ~1900 points.

Times are the agent's monotonic clock, so a wall-clock jump does not move the windows (docs/reporting.md,
"Times and pods").
"""

from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from koordqos.metrics.types import MetricSnapshot

#: koordlet `--collect-sys-metric-outdated-interval`: older pod/app points do not enter a system tick
SYSTEM_STALE_SECONDS = 10.0
PODS_PER_STEP = 200  # `ingest_steps` stops after this many pods (~0.5 ms of appends)
DEFAULT_MAX_POINTS = 4096


class Series:
    """A ring of (time, value) points, oldest overwritten first; optional averaging of `stride` samples."""

    __slots__ = ("_acc", "_acc_n", "_acc_t", "_head", "_n", "_t", "_v", "cap", "stride")

    def __init__(self, cap: int, stride: int = 1) -> None:
        self.cap = max(int(cap), 1)
        self.stride = max(int(stride), 1)
        # preallocated: memory is the steady state from the first sample (what the budget measures)
        self._t = array("d", bytes(8 * self.cap))
        self._v = array("d", bytes(8 * self.cap))
        self._head = 0  # index of the oldest point once the ring is full
        self._n = 0
        self._acc = 0.0
        self._acc_n = 0
        self._acc_t = 0.0

    def __len__(self) -> int:
        return self._n

    def append(self, t: float, value: float) -> None:
        """Add a sample (times must not decrease); with stride k, every k-th call stores the mean."""
        if self.stride > 1:
            self._acc += value
            self._acc_n += 1
            self._acc_t = t
            if self._acc_n < self.stride:
                return
            value = self._acc / self._acc_n
            self._acc = 0.0
            self._acc_n = 0
        if self._n < self.cap:
            self._t[self._n] = t
            self._v[self._n] = value
            self._n += 1
            return
        self._t[self._head] = t
        self._v[self._head] = value
        self._head = (self._head + 1) % self.cap

    def _newest_first(self) -> Iterator[int]:
        n, cap, head = self._n, self.cap, self._head
        if n < cap:
            yield from range(n - 1, -1, -1)
            return
        for i in range(cap):
            yield (head - 1 - i) % cap

    def _segments(self) -> tuple[tuple[int, int], ...]:
        """The stored points as (start, end) index ranges, oldest first; each is sorted by time."""
        if self._n < self.cap:
            return ((0, self._n),)
        return ((self._head, self.cap), (0, self._head))

    def window(self, start: float, end: float) -> tuple[list[float], float | None, float | None]:
        """Values with `start <= t <= end` (oldest first) and the times of the first and last of them.

        Times are sorted within each ring segment, so the bounds are two bisections and the values one
        C-level slice: a 300-point window of 200 pods costs microseconds, not a Python loop per point."""
        out: list[float] = []
        first = last = None
        t, v = self._t, self._v
        for lo, hi in self._segments():
            if lo >= hi:
                continue
            i = bisect_left(t, start, lo, hi)
            j = bisect_right(t, end, i, hi)
            if i < j:
                out.extend(v[i:j].tolist())
                if first is None:
                    first = t[i]
                last = t[j - 1]
        if self._acc_n and start <= self._acc_t <= end:  # the partial group counts as its mean so far
            out.append(self._acc / self._acc_n)
            first = self._acc_t if first is None else first
            last = self._acc_t
        return out, first, last

    def latest(self) -> tuple[float, float] | None:
        """The newest (time, value), None when empty (a partial stride group counts as its mean)."""
        if self._acc_n:
            return self._acc_t, self._acc / self._acc_n
        if not self._n:
            return None
        i = self._n - 1 if self._n < self.cap else (self._head - 1) % self.cap
        return self._t[i], self._v[i]

    def resized(self, cap: int, stride: int) -> Series:
        """A copy with another capacity/stride holding the newest points that fit."""
        out = Series(cap, stride)
        points = [(self._t[i], self._v[i]) for i in self._newest_first()]
        if self._acc_n:  # the partial group becomes a point of its own
            points.insert(0, (self._acc_t, self._acc / self._acc_n))
        points = points[: out.cap]
        for i, (t, v) in enumerate(reversed(points)):
            out._t[i] = t
            out._v[i] = v
        out._n = len(points)
        return out

    def nbytes(self) -> int:
        """Bytes held by the point arrays (preallocated to the capacity)."""
        return self._t.itemsize * (len(self._t) + len(self._v))


@dataclass(slots=True)
class EntitySeries:
    """CPU (cores) and memory (bytes) series of a pod or host application, both memory definitions."""

    cpu: Series
    memory: Series  # anon + unevictable (usageWithoutPageCache: docs/reporting.md)
    memory_with_cache: Series  # anon + unevictable + active/inactive file (usageWithPageCache)


@dataclass(slots=True)
class NumaSeries:
    """One NUMA node's usage (cores, bytes) and its per-tick system part (numaUsages, docs/prediction.md)."""

    cpu: Series
    memory: Series
    system_cpu: Series
    system_memory: Series

    def nbytes(self) -> int:
        """Bytes of the four rings."""
        return sum(s.nbytes() for s in (self.cpu, self.memory, self.system_cpu, self.system_memory))


#: node-level series names
NODE_CPU = "node_cpu"
NODE_MEMORY = "node_memory"  # MemTotal − MemAvailable
NODE_MEMORY_WITH_CACHE = "node_memory_with_cache"  # MemTotal − MemFree
SYSTEM_CPU = "system_cpu"
SYSTEM_MEMORY = "system_memory"
NODE_SERIES = (NODE_CPU, NODE_MEMORY, NODE_MEMORY_WITH_CACHE, SYSTEM_CPU, SYSTEM_MEMORY)


def _recent(series: Series, horizon: float) -> float:
    """The latest value if its time is not before `horizon`, else 0."""
    point = series.latest()
    return point[1] if point is not None and point[0] >= horizon else 0.0


def _sizing(retention: float, interval: float, max_points: int) -> tuple[int, int]:
    """(capacity, stride) so that `retention` fits at `interval` in at most `max_points` points."""
    needed = math.ceil(retention / max(interval, 1e-3)) + 2
    stride = max(1, math.ceil(needed / max_points))
    return math.ceil(needed / stride), stride


class ReportHistory:
    """The report's time series, fed one `MetricSnapshot` per collection round."""

    def __init__(
        self,
        collect_interval: float = 1.0,
        *,
        node_retention: float = 1860.0,
        pod_retention: float = 360.0,
        max_points: int = DEFAULT_MAX_POINTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.collect_interval = collect_interval
        self.max_points = max_points
        self.clock = clock
        self.node_retention = node_retention
        self.pod_retention = pod_retention
        cap, stride = _sizing(node_retention, collect_interval, max_points)
        self.node: dict[str, Series] = {name: Series(cap, stride) for name in NODE_SERIES}
        self.pods: dict[str, EntitySeries] = {}  # by pod uid
        self.apps: dict[str, EntitySeries] = {}  # by NodeSLO host application name
        self.numa: dict[int, NumaSeries] = {}  # by NUMA node id (kept for the aggregate window, as pods)
        self._pod_sizing = _sizing(pod_retention, collect_interval, max_points)
        self.ticks = 0
        self.system_ticks_skipped = 0
        # pods' series are kept at least this long whatever the collection policy (the prediction's
        # training window); 0: the policy's retention alone
        self.min_pod_retention = 0.0

    # -- sizing --------------------------------------------------------------------------------------------

    def configure(self, node_retention: float, pod_retention: float) -> None:
        """Follow a policy change: keep node/system series for `node_retention` s, pods/apps for
        `pod_retention` s (existing points are kept as far as they fit)."""
        if node_retention != self.node_retention:
            cap, stride = _sizing(node_retention, self.collect_interval, self.max_points)
            self.node = {k: s.resized(cap, stride) for k, s in self.node.items()}
            self.node_retention = node_retention
        pod_retention = max(pod_retention, self.min_pod_retention)
        if pod_retention != self.pod_retention:
            cap, stride = self._pod_sizing = _sizing(pod_retention, self.collect_interval, self.max_points)
            for group in (self.pods, self.apps):
                for key, e in group.items():
                    group[key] = EntitySeries(
                        e.cpu.resized(cap, stride),
                        e.memory.resized(cap, stride),
                        e.memory_with_cache.resized(cap, stride),
                    )
            for node_id, n in self.numa.items():
                self.numa[node_id] = NumaSeries(
                    n.cpu.resized(cap, stride),
                    n.memory.resized(cap, stride),
                    n.system_cpu.resized(cap, stride),
                    n.system_memory.resized(cap, stride),
                )
            self.pod_retention = pod_retention

    def _entity(self) -> EntitySeries:
        cap, stride = self._pod_sizing
        return EntitySeries(Series(cap, stride), Series(cap, stride), Series(cap, stride))

    # -- feeding -------------------------------------------------------------------------------------------

    def ingest(self, snap: MetricSnapshot, at: float | None = None) -> None:
        """Store one round and derive the round's system usage (docs/reporting.md, "System usage per
        tick")."""
        for _ in self.ingest_steps(snap, at):
            pass

    def ingest_steps(self, snap: MetricSnapshot, at: float | None = None) -> Iterator[None]:
        """`ingest` in slices: stops after every PODS_PER_STEP pods so a caller can give the loop a turn.

        A report must not begin between two slices (it would see the round in part): the reporter waits for
        a round in progress to end. Every point of a round has the round's time and a report's windows end
        when it began, so a round that begins while a report is built is outside that report's windows."""
        t = self.clock() if at is None else at
        self.ticks += 1
        node = snap.node
        ns = self.node
        if node.cpu_usage_cores is not None:
            ns[NODE_CPU].append(t, node.cpu_usage_cores)
        if node.memory_used is not None:
            ns[NODE_MEMORY].append(t, float(node.memory_used))
        if node.memory_used_with_cache is not None:
            ns[NODE_MEMORY_WITH_CACHE].append(t, float(node.memory_used_with_cache))
        # the round's Σ pods and Σ apps for the system tick are summed while storing (one pass); an entity
        # without a value this round contributes its latest point if not older than 10 s (koordlet's rule)
        horizon = t - SYSTEM_STALE_SECONDS
        sum_cpu = 0.0
        sum_mem = 0.0
        done = 0
        for group, samples in ((self.pods, snap.pods), (self.apps, snap.host_apps)):
            for key, sample in samples.items():
                done += 1
                if done % PODS_PER_STEP == 0:
                    yield
                e = group.get(key)
                if e is None:
                    e = group[key] = self._entity()
                cpu = sample.cpu_usage_cores
                if cpu is not None:
                    e.cpu.append(t, cpu)
                    sum_cpu += cpu
                else:
                    sum_cpu += _recent(e.cpu, horizon)
                anon = sample.memory_anon
                if anon is not None:
                    e.memory.append(t, float(anon))
                    sum_mem += anon
                else:
                    sum_mem += _recent(e.memory, horizon)
                if sample.memory_with_cache is not None:
                    e.memory_with_cache.append(t, float(sample.memory_with_cache))
        for group, samples in ((self.pods, snap.pods), (self.apps, snap.host_apps)):
            if len(group) != len(samples):  # entities not sampled this round (e.g. a vanished cgroup)
                for key, e in group.items():
                    if key not in samples:
                        sum_cpu += _recent(e.cpu, horizon)
                        sum_mem += _recent(e.memory, horizon)
        system_cpu: float | None = None
        if node.cpu_usage_cores is None or node.memory_used is None:
            self.system_ticks_skipped += 1
        else:
            # system = max(node − Σ pods − Σ host apps, 0) per tick, without-page-cache memory always
            # (docs/reporting.md)
            system_cpu = max(node.cpu_usage_cores - sum_cpu, 0.0)
            ns[SYSTEM_CPU].append(t, system_cpu)
            ns[SYSTEM_MEMORY].append(t, max(float(node.memory_used) - sum_mem, 0.0))
        if node.numa:
            self._ingest_numa(snap, t, system_cpu)

    def _ingest_numa(self, snap: MetricSnapshot, t: float, system_cpu: float | None) -> None:
        """Per NUMA node: its usage, and its system part: memory = max(NUMA memory − Σ pods' memory on it,
        0) (one NUMA node: all of the pods' anonymous memory), CPU = the node's system CPU × its share of
        the NUMA CPU usage (0 when they sum to 0)."""
        numa = snap.node.numa
        pod_mem: dict[int, float] = {}
        if len(numa) == 1:
            pod_mem[numa[0].node] = float(sum(p.memory_anon or 0 for p in snap.pods.values()))
        else:
            for p in snap.pods.values():
                for node_id, used in (p.numa_memory or {}).items():
                    pod_mem[node_id] = pod_mem.get(node_id, 0.0) + used
        cpu_total = sum(n.cpu_usage_cores or 0.0 for n in numa)
        cap, stride = self._pod_sizing
        for n in numa:
            series = self.numa.get(n.node)
            if series is None:
                series = self.numa[n.node] = NumaSeries(
                    Series(cap, stride), Series(cap, stride), Series(cap, stride), Series(cap, stride)
                )
            if n.cpu_usage_cores is not None:
                series.cpu.append(t, n.cpu_usage_cores)
                if system_cpu is not None:
                    share = n.cpu_usage_cores / cpu_total if cpu_total > 0 else 0.0
                    series.system_cpu.append(t, system_cpu * share)
            if n.memory_used is not None:
                series.memory.append(t, float(n.memory_used))
                series.system_memory.append(t, max(float(n.memory_used) - pod_mem.get(n.node, 0.0), 0.0))

    def retain_pods(self, uids: Collection[str]) -> list[str]:
        """Forget pods not in `uids` (a pod recreated under the same name is a new uid, docs/reporting.md
        "Times and pods")."""
        gone = [u for u in self.pods if u not in uids]
        for uid in gone:
            del self.pods[uid]
        return gone

    def retain_apps(self, names: Collection[str]) -> list[str]:
        """Forget host applications no longer in the NodeSLO."""
        gone = [n for n in self.apps if n not in names]
        for name in gone:
            del self.apps[name]
        return gone

    # -- reading -------------------------------------------------------------------------------------------

    def nbytes(self) -> int:
        """Bytes held by all point arrays (the history's memory, without Python object overhead)."""
        total = sum(s.nbytes() for s in self.node.values()) + sum(n.nbytes() for n in self.numa.values())
        for group in (self.pods, self.apps):
            for e in group.values():
                total += e.cpu.nbytes() + e.memory.nbytes() + e.memory_with_cache.nbytes()
        return total
