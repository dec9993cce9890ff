"""LoopHistogram and FastCounter: exported exactly as prometheus_client's Histogram and Counter export the
same observations; FastCounter counts exactly from several threads."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from koordqos.observability import FastCounter, LoopHistogram

BUCKETS = (0.000005, 0.00001, 0.000025, 0.0001, 0.01, 1)


def _exposition(registry: CollectorRegistry) -> list[str]:
    # `_created` holds construction times, which differ between the two: compare everything else
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.floats(min_value=0, max_value=5, allow_nan=False)),
        max_size=50,
    )
)
def test_loop_histogram_exports_like_prometheus_client(observations: list[tuple[str, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LoopHistogram("koordqos_x_seconds", "help text", ["hook"], BUCKETS, registry=ours)
    ref = Histogram("koordqos_x_seconds", "help text", ["hook"], buckets=BUCKETS, registry=theirs)
    for label in ("a", "b"):  # children exist before the first observation, as labels() makes them
        fast.labels(label)
        ref.labels(label)
    for label, value in [*observations, ("a", 0.00001), ("b", 0.01)]:  # values on a bucket bound too
        fast.labels(label).observe(value)
        ref.labels(label).observe(value)
    assert _exposition(ours) == _exposition(theirs)
    count = ours.get_sample_value("koordqos_x_seconds_count", {"hook": "a"})
    assert count == sum(1 for label, _ in observations if label == "a") + 1
    assert ours.get_sample_value("koordqos_x_seconds_created", {"hook": "a"}) is not None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.one_of(st.just(1), st.integers(min_value=0, max_value=1000)),  # exact sums in any order
        ),
        max_size=50,
    )
)
def test_fast_counter_exports_like_prometheus_client(increments: list[tuple[str, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = FastCounter("koordqos_y_total", "help text", ["kind"], registry=ours)
    ref = Counter("koordqos_y_total", "help text", ["kind"], registry=theirs)
    for label in ("a", "b"):
        fast.labels(label)
        ref.labels(label)
    for label, amount in increments:
        fast.labels(label).inc(amount)
        ref.labels(label).inc(amount)
    assert _exposition(ours) == _exposition(theirs)
    assert ours.get_sample_value("koordqos_y_created", {"kind": "b"}) is not None


def test_fast_counter_sums_fractional_amounts() -> None:
    counter = FastCounter("koordqos_w_total", "help text", ["kind"], registry=None)
    child = counter.labels("a")
    for amount in (1, 252.9435178377249, 1, 1.9435178377248974, 0):
        child.inc(amount)
    assert child.get() == pytest.approx(256.887035675449, rel=1e-12)


def test_fast_counter_loses_no_increment_across_threads() -> None:
    counter = FastCounter("koordqos_z_total", "help text", ["kind"], registry=None)
    child = counter.labels("a")

    def work() -> None:
        for _ in range(50_000):
            child.inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert child.get() == 200_000
    with pytest.raises(ValueError, match="non-negative"):
        child.inc(-1)
