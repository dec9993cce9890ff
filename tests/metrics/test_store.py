"""MetricStore: ring buffers, retention, window queries ending now, dropping deleted pods."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import (
    BESample,
    ContainerSample,
    MetricKind,
    MetricSnapshot,
    NodeSample,
    PodSample,
)

K = MetricKind.NODE_CPU_USAGE


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def filled(values: list[float], start: float = 0.0) -> tuple[MetricStore, Clock]:
    clock = Clock()
    store = MetricStore(retention_seconds=600, collect_interval=1.0, clock=clock)
    for i, v in enumerate(values):
        store.add(K, "", v, at=start + i)
    clock.now = start + len(values) - 1
    return store, clock


def test_last_uses_two_interval_window() -> None:
    store, clock = filled([1.0, 2.0, 3.0])
    assert store.last(K) == 3.0
    clock.now += 1.5
    assert store.last(K) == 3.0
    clock.now += 1.0  # newest sample is now 2.5 s old > 2 × interval
    assert store.last(K) is None
    assert store.last(K, window=10) == 3.0
    assert store.last(K, "other") is None


def test_window_queries() -> None:
    store, _ = filled([float(v) for v in range(1, 11)])  # t = 0..9, now = 9
    assert store.count(K, window=4) == 5  # t 5..9 inclusive
    assert store.values(K, window=4) == [6.0, 7.0, 8.0, 9.0, 10.0]
    assert store.avg(K, window=4) == 8.0
    assert store.avg(K, window=100) == 5.5
    assert store.percentile(K, p=50, window=100) == 5.0  # nearest rank
    assert store.percentile(K, p=90, window=100) == 9.0
    assert store.percentile(K, p=100, window=100) == 10.0
    assert store.avg(K, "nothing", window=10) is None
    assert store.percentile(K, "nothing", p=50, window=10) is None
    with pytest.raises(ValueError, match="percentile"):
        store.percentile(K, p=0)


def test_future_samples_excluded() -> None:
    store, clock = filled([1.0, 2.0])
    store.add(K, "", 99.0, at=clock.now + 5)
    assert store.last(K) == 2.0
    assert store.count(K, window=10) == 2


def test_retention_trims_old_samples() -> None:
    clock = Clock(0)
    store = MetricStore(retention_seconds=10, collect_interval=1.0, clock=clock)
    for t in range(30):
        store.add(K, "", float(t), at=float(t))
    clock.now = 29
    assert store.count(K, window=1000) == 11  # t 19..29
    assert store.values(K, window=1000)[0] == 19.0


def test_ingest_and_drop_pod() -> None:
    clock = Clock(50)
    store = MetricStore(clock=clock)
    snap = MetricSnapshot(
        at=50,
        interval=1,
        node=NodeSample(cpu_usage_cores=1.25, memory_used=100, memory_used_with_cache=200),
        pods={
            "u1": PodSample("u1", 0.5, 10, (ContainerSample("containerd://c1", "c", 0.25, 5, 0.1),)),
            "u2": PodSample("u2", None, 20),
        },
        be=BESample(usage_milli=300, request_milli=1000, real_limit_milli=2000),
    )
    store.ingest(snap)
    assert store.last(MetricKind.NODE_CPU_USAGE) == 1.25
    assert store.last(MetricKind.NODE_MEMORY_USAGE) == 100
    assert store.last(MetricKind.POD_CPU_USAGE, "u1") == 0.5
    assert store.last(MetricKind.POD_CPU_USAGE, "u2") is None  # None values are not stored
    assert store.last(MetricKind.CONTAINER_CPU_THROTTLED, "containerd://c1") == 0.1
    assert store.last(MetricKind.BE_CPU_REQUEST) == 1000
    assert sorted(store.keys(MetricKind.POD_MEMORY_USAGE)) == ["u1", "u2"]
    assert store.retain_pods(["u2"]) == ["u1"]
    assert store.last(MetricKind.POD_CPU_USAGE, "u1") is None
    assert store.last(MetricKind.CONTAINER_CPU_USAGE, "containerd://c1") is None
    assert store.last(MetricKind.POD_MEMORY_USAGE, "u2") == 20


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60), st.floats(1, 99), st.floats(1, 99)
)
def test_percentile_monotonic_and_bounded(values: list[float], p1: float, p2: float) -> None:
    store, _ = filled(values)
    lo, hi = sorted((p1, p2))
    a = store.percentile(K, p=lo, window=1000)
    b = store.percentile(K, p=hi, window=1000)
    assert a is not None
    assert b is not None
    assert min(values) <= a <= b <= max(values)
    avg = store.avg(K, window=1000)
    assert avg is not None
    assert min(values) - 1e-6 <= avg <= max(values) + 1e-6


# -- the ring buffer behind each series ---------------------------------------------------------------------


@given(
    maxlen=st.integers(min_value=1, max_value=70),
    ops=st.lists(st.one_of(st.floats(0, 1e6, allow_nan=False), st.just(None)), max_size=300),
)
def test_ring_behaves_as_a_bounded_deque_with_trimming(maxlen: int, ops: list[float | None]) -> None:
    from collections import deque

    from koordqos.metrics.store import _Ring

    ring, model = _Ring(maxlen), deque[tuple[float, float]](maxlen=maxlen)
    t = 0.0
    for op in ops:
        if op is None:  # trim the oldest third of the time range seen so far
            horizon = t / 3
            ring.trim(horizon)
            while model and model[0][0] < horizon:
                model.popleft()
        else:
            t += 1.0
            ring.append(t, op)
            model.append((t, op))
        assert len(ring) == len(model)
        assert list(ring.newest_first()) == list(reversed(model))


def test_samples_are_not_objects_the_garbage_collector_walks() -> None:
    # a deque of (t, v) tuples made every sample a GC-tracked object: a full collection walked them all
    # (14-17 ms in one loop step at 1,000 pods)
    store = MetricStore(retention_seconds=10_000, collect_interval=1.0, clock=lambda: 20_000.0)
    store.add(MetricKind.NODE_CPU_USAGE, "", 1.0, at=1.0)
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for i in range(5_000):
            store.add(MetricKind.NODE_CPU_USAGE, "", float(i), at=2.0 + i)
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert grown < 50, grown
    assert store.values(MetricKind.NODE_CPU_USAGE, window=3.0) == []  # clock at 20,000: outside the window
    assert store.last(MetricKind.NODE_CPU_USAGE, window=20_000.0) == 4_999.0
