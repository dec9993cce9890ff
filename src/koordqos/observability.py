"""Prometheus metrics shared by every component (one registry, defined once per process)."""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

REGISTRY: CollectorRegistry = CollectorRegistry(auto_describe=True)
# the agent's own CPU, memory and open files (process_*) and Python's version, as every exporter has them
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)


class LoopHistogramChild:
    """One label set of a LoopHistogram: plain counts, no lock."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative; the last bound is +Inf
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class LoopHistogram(Collector):
    """A labelled histogram for the runtime-call hot path, exported exactly like prometheus_client's.

    prometheus_client takes a lock per bucket and per sum on every observation and walks the buckets in
    Python (≈ 2 µs per `observe` here, 8 per NRI CreateContainer); this one is observed from the event loop
    thread only, so it keeps plain counts (a bisect and two additions) and builds the cumulative samples
    when scraped.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = sorted(float(b) for b in buckets)
        if self._bounds[-1] != float("inf"):
            self._bounds.append(float("inf"))
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> LoopHistogramChild:
        """The child for these label values (created on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[values] = LoopHistogramChild(self._bounds)
        return child

    def describe(self) -> list[Metric]:
        """The metric without samples (registration checks names with it)."""
        return [Metric(self.name, self.documentation, "histogram")]

    def collect(self) -> Iterator[Metric]:
        """The samples prometheus_client's Histogram would give: _bucket (cumulative), _count, _sum,
        _created."""
        metric = Metric(self.name, self.documentation, "histogram")
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            total = 0
            for bound, count in zip(self._bounds, list(child.counts), strict=True):
                total += count
                le = floatToGoString(bound)  # type: ignore[no-untyped-call]  # the exact `le` text
                metric.add_sample(f"{self.name}_bucket", {**labels, "le": le}, total)
            metric.add_sample(f"{self.name}_count", labels, total)
            metric.add_sample(f"{self.name}_sum", labels, child.sum)
            metric.add_sample(f"{self.name}_created", labels, child.created)
        yield metric


class FastCounterChild:
    """One label set of a FastCounter: `inc()` is one C-level step (thread-safe under the GIL), no lock."""

    __slots__ = ("_extra", "_lock", "_n", "created")

    def __init__(self) -> None:
        self._n = itertools.count()  # next() increments atomically, from any thread
        self._extra = 0.0  # amounts other than 1 (rare): under a lock
        self._lock = threading.Lock()
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        """Count `amount` (>= 0)."""
        if amount == 1:
            next(self._n)
        elif amount > 0:
            with self._lock:
                self._extra += amount
        elif amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")

    def get(self) -> float:
        """The current value."""
        done = self._n.__reduce__()[1][0]  # the value next() would return = the count so far
        return int(done) + self._extra


class FastCounter(Collector):
    """A labelled counter for hot paths (every bus event, decision and NRI request), exported exactly like
    prometheus_client's Counter (`<name>_total`, `<name>_created`): prometheus_client takes a lock and checks
    its state in Python on every `inc()` (≈ 1.5 µs here, three per NRI CreateContainer)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], FastCounterChild] = {}
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> FastCounterChild:
        """The child for these label values (created on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            with self._lock:
                child = self._children.setdefault(values, FastCounterChild())
        return child

    def describe(self) -> list[Metric]:
        """The metric without samples (registration checks names with it)."""
        return [Metric(self.name, self.documentation, "counter")]

    def collect(self) -> Iterator[Metric]:
        """`_total` and `_created` per label set, as prometheus_client's Counter gives them."""
        metric = Metric(self.name, self.documentation, "counter")
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            metric.add_sample(f"{self.name}_total", labels, child.get())
            metric.add_sample(f"{self.name}_created", labels, child.created)
        yield metric


DECISIONS = FastCounter(
    "koordqos_decisions_total",
    "Actions taken (or recorded in dry-run) by strategy and action",
    ["strategy", "action", "dry_run"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "koordqos_errors_total",
    "Errors handled without stopping the agent, by component and kind",
    ["component", "kind"],
    registry=REGISTRY,
)
SUBSCRIBER_ERRORS = Counter(
    "koordqos_bus_subscriber_errors_total",
    "Exceptions raised by bus subscribers",
    ["subscriber"],
    registry=REGISTRY,
)
BUS_EVENTS = FastCounter(
    "koordqos_bus_events_total",
    "Events published on the bus by type",
    ["type"],
    registry=REGISTRY,
)
BUS_COALESCED = Counter(
    "koordqos_bus_coalesced_total",
    "Tick events replaced by a newer one before delivery",
    ["subscriber"],
    registry=REGISTRY,
)
BUS_BACKPRESSURE = Counter(
    "koordqos_bus_backpressure_total",
    "Times a publisher waited for a full subscriber queue",
    ["subscriber"],
    registry=REGISTRY,
)
HOOK_ERRORS = Counter(
    "koordqos_hook_errors_total",
    "Runtime hook failures (kind: error, timeout) in runtime calls (NRI requests, proxy RPCs)",
    ["hook", "kind"],
    registry=REGISTRY,
)
REQUEST_SECONDS = LoopHistogram(
    "koordqos_bus_request_seconds",
    "Time to serve one runtime call (NRI request, proxy RPC) in the hook core, by call",
    ["type"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2),
    registry=REGISTRY,
)
COMPONENT_RESTARTS = Counter(
    "koordqos_component_restarts_total",
    "Component crashes followed by a restart",
    ["component"],
    registry=REGISTRY,
)
LOOP_LAG = Histogram(
    "koordqos_event_loop_lag_seconds",
    "How late the event loop woke a periodic probe",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
    registry=REGISTRY,
)
BUILD_INFO = Gauge(
    "koordqos_build_info",
    "1, labelled with the version and the build: interpreted, or compiled with the count of compiled modules",
    ["version", "build"],
    registry=REGISTRY,
)
READY = Gauge("koordqos_ready", "1 once the pod, Node and NodeSLO sources have synced", registry=REGISTRY)
NRI_CONNECTED = Gauge(
    "koordqos_nri_connected", "1 while the NRI plugin is registered with a runtime", registry=REGISTRY
)
