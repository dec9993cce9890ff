"""ReportHistory: bounded rings, stride averaging, per-tick system usage (docs/reporting.md, "System usage per
tick")."""

from __future__ import annotations

from koordqos.report.history import (
    NODE_CPU,
    SYSTEM_CPU,
    SYSTEM_MEMORY,
    ReportHistory,
    Series,
)

from .conftest import FakeClock, GiB, feed, snapshot


def test_series_ring_keeps_the_newest_points() -> None:
    s = Series(cap=5)
    for i in range(12):
        s.append(float(i), float(i * 10))
    assert len(s) == 5
    values, first, last = s.window(0.0, 100.0)
    assert values == [70.0, 80.0, 90.0, 100.0, 110.0]
    assert (first, last) == (7.0, 11.0)
    assert s.latest() == (11.0, 110.0)
    assert s.window(9.0, 10.0)[0] == [90.0, 100.0]


def test_series_stride_stores_means() -> None:
    s = Series(cap=10, stride=3)
    for i in range(9):
        s.append(float(i), float(i))
    assert s.window(0.0, 100.0)[0] == [1.0, 4.0, 7.0]
    s.append(9.0, 9.0)  # a partial group is visible as its mean so far
    s.append(10.0, 11.0)
    assert s.window(0.0, 100.0) == ([1.0, 4.0, 7.0, 10.0], 2.0, 10.0)
    assert s.latest() == (10.0, 10.0)


def test_resize_keeps_newest() -> None:
    s = Series(cap=10)
    for i in range(10):
        s.append(float(i), float(i))
    r = s.resized(4, 1)
    assert r.window(0, 100)[0] == [6.0, 7.0, 8.0, 9.0]
    strided = Series(10, stride=3)
    strided.append(1.0, 3.0)  # a partial group only
    assert strided.resized(10, 1).window(0, 100)[0] == [3.0]


def test_memory_is_bounded_by_retention_not_by_uptime() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, node_retention=120.0, pod_retention=30.0, clock=clock)
    snap = snapshot(1.0, GiB, {f"uid-{i}": (0.1, 1 << 20) for i in range(20)})
    feed(h, clock, 200, snap)
    size = h.nbytes()
    feed(h, clock, 500, snap)
    assert h.nbytes() == size
    # 5 node series × (120 + 2) points + 20 pods × 3 series × (30 + 2) points, 16 bytes a point
    assert size == (5 * 122 + 20 * 3 * 32) * 16


def test_long_retention_is_downsampled_to_max_points() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, node_retention=86400.0, pod_retention=300.0, max_points=1000, clock=clock)
    assert h.node[NODE_CPU].cap <= 1000
    assert h.node[NODE_CPU].stride == 87  # ceil(86402 / 1000)


def test_system_usage_is_clamped_per_tick() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, clock=clock)
    feed(h, clock, 1, snapshot(2.0, 10 * GiB, {"a": (1.5, 4 * GiB)}))
    feed(h, clock, 1, snapshot(1.0, 3 * GiB, {"a": (1.5, 4 * GiB)}))  # pods above node: clamp to 0
    values = h.node[SYSTEM_CPU].window(0, clock.t)[0]
    assert values == [0.5, 0.0]
    assert h.node[SYSTEM_MEMORY].window(0, clock.t)[0] == [6.0 * GiB, 0.0]


def test_system_tick_skipped_without_node_sample_and_stale_pods_ignored() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, clock=clock)
    feed(h, clock, 1, snapshot(None, 10 * GiB, {"a": (1.0, GiB)}))
    assert len(h.node[SYSTEM_CPU]) == 0
    assert h.system_ticks_skipped == 1
    clock.t += 11.0  # pod "a" last seen 11 s ago: stale for the next system tick
    feed(h, clock, 1, snapshot(2.0, 4 * GiB, {}))
    assert h.node[SYSTEM_CPU].window(0, clock.t)[0] == [2.0]


def test_retain_drops_gone_pods() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, clock=clock)
    feed(h, clock, 2, snapshot(1.0, GiB, {"a": (0.1, 1), "b": (0.1, 1)}))
    assert h.retain_pods({"b"}) == ["a"]
    assert set(h.pods) == {"b"}
