"""LoopHistogram: exported exactly as prometheus_client's Histogram would export the same observations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest

from koordqos.observability import LoopHistogram

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
