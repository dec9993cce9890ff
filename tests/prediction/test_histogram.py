"""koordlet's histogram test vectors and truncated bucket starts (docs/prediction.md, "Histogram" and
"Decay")."""

from __future__ import annotations

import pytest

from koordqos.prediction.histogram import (
    CPU_LAYOUT,
    MEMORY_LAYOUT,
    DecayingHistogram,
    ExponentialLayout,
    Histogram,
    HistogramCheckpoint,
    HistogramError,
    LinearLayout,
    round_to_half_life,
)

HOUR_NS = 3600 * 10**9
START_NS = 1234567890 * 10**9


# -- koordlet's histogram options ----------------------------------------------------------------------------


def test_linear_layout() -> None:
    lay = LinearLayout(5.0, 0.3, 0.001)
    assert lay.num_buckets == 18
    assert lay.start(0) == 0.0
    assert lay.start(17) == pytest.approx(5.1)
    assert [lay.find(v) for v in (-1, 0, 1.3, 100)] == [0, 0, 4, 17]


def test_exponential_layout() -> None:
    lay = ExponentialLayout(500, 40, 1.5, 0.001)
    assert lay.num_buckets == 6
    assert [lay.start(b) for b in range(6)] == pytest.approx([0, 40, 100, 190, 325, 527.5])
    assert [lay.find(v) for v in (-1, 39.99, 40, 100, 900)] == [0, 0, 1, 2, 5]


def test_model_layouts_match_the_spec() -> None:
    """158 CPU and 205 memory buckets, the truncated starts (docs/prediction.md, "Histogram")."""
    assert CPU_LAYOUT.num_buckets == 158
    assert MEMORY_LAYOUT.num_buckets == 205
    assert int(CPU_LAYOUT.start(1) * 1000) == 25
    assert int(CPU_LAYOUT.start(157) * 1000) == 1060437
    assert int(MEMORY_LAYOUT.start(1)) == 5242880
    assert int(MEMORY_LAYOUT.start(204)) == 2203922208858
    cpu_m = {
        2: 51, 9: 275, 10: 314, 22: 962, 23: 1035, 26: 1277, 27: 1366, 45: 3992, 71: 15473,
        106: 87612, 107: 92017, 108: 96643, 109: 101500,
    }  # fmt: skip
    for b, milli in cpu_m.items():
        assert int(CPU_LAYOUT.start(b) * 1000) == milli, b
    mem = {
        2: 10747903, 17: 135477939, 27: 286623669, 49: 1040327180, 50: 1097586419, 62: 2054559099,
        63: 2162529934, 70: 3085584358, 71: 3245106456, 73: 3588477771, 100: 13684048694,
        150: 158018043490,
    }  # fmt: skip
    for b, start in mem.items():
        assert int(MEMORY_LAYOUT.start(b)) == start, b


# -- koordlet's plain histogram vectors ----------------------------------------------------------------------

LIN10 = LinearLayout(10, 1.0, 1e-15)


@pytest.mark.parametrize("p", [-0.5, 0, 0.5, 1, 1.5])
def test_empty_histogram_percentile_is_zero(p: float) -> None:
    assert Histogram(LIN10).percentile(p) == 0.0


def test_percentiles_are_bucket_ends() -> None:
    h = Histogram(LIN10)
    for v in (1, 2, 3, 4):
        h.add(v, v)
    want = {0: 2, 0.1: 2, 0.2: 3, 0.3: 3, 0.4: 4, 0.5: 4, 0.6: 4, 0.7: 5, 0.8: 5, 0.9: 5, 1.0: 5}
    assert {p: h.percentile(p) for p in want} == want


def test_percentiles_out_of_range_and_extremes() -> None:
    lay = LinearLayout(1.0, 0.1, 1e-15)
    h = Histogram(lay)
    h.add(0.1, 0.1)
    h.add(0.2, 0.2)
    assert h.percentile(-0.1) == pytest.approx(0.2)
    assert h.percentile(1.1) == pytest.approx(0.3)
    h.add(0.0, 0.1)
    h.add(1.0, 0.2)
    assert h.percentile(-0.1) == pytest.approx(0.1)
    assert h.percentile(1.1) == pytest.approx(1.0)


def test_a_bucket_below_epsilon_is_empty() -> None:
    eps = 1e-4
    h = Histogram(LinearLayout(1.0, 0.1, eps))
    h.add(0.1, 2.5 * eps)
    assert not h.empty
    h.subtract(0.1, eps)
    assert not h.empty
    h.subtract(0.1, eps)
    assert h.empty


def test_save_scales_the_largest_bucket_to_10000() -> None:
    h = Histogram(LIN10)
    h.add(1, 1)
    assert h.save() == HistogramCheckpoint(None, {1: 10000}, 1.0)
    h.add(2, 100000)
    assert h.save() == HistogramCheckpoint(None, {2: 10000}, 100001.0)
    h = Histogram(LIN10)
    h.add(1, 1)
    h.add(2, 10000)
    h.add(3, 50)
    assert h.save() == HistogramCheckpoint(None, {1: 1, 2: 10000, 3: 50}, 10051.0)
    assert Histogram(LIN10).save() == HistogramCheckpoint(None, {}, 0.0)


def test_load_rescales_to_the_total() -> None:
    h = Histogram(LIN10)
    h.load(HistogramCheckpoint(None, {0: 1, 1: 2}, 6.0))
    assert (h.weights[0], h.weights[1], h.total) == (2.0, 4.0, 6.0)


@pytest.mark.parametrize(
    "cp",
    [
        HistogramCheckpoint(None, {-1: 1}, 1.0),
        HistogramCheckpoint(None, {99: 1}, 1.0),
        HistogramCheckpoint(None, {0: 1}, -1.0),
        HistogramCheckpoint(None, {0: 1}, float("nan")),
    ],
)
def test_load_errors_change_nothing(cp: HistogramCheckpoint) -> None:
    h = Histogram(LIN10)
    with pytest.raises(HistogramError):
        h.load(cp)
    assert h.empty
    assert h.total == 0.0


def test_load_of_all_zero_weights_loads_nothing() -> None:
    h = Histogram(LIN10)
    h.load(HistogramCheckpoint(None, {0: 0, 3: 0}, 5.0))
    assert h.empty
    assert h.total == 0.0


# -- koordlet's decaying histogram vectors (docs/prediction.md, "Decay") -------------------------------------


def test_decay_favours_newer_samples() -> None:
    h = DecayingHistogram(LIN10, HOUR_NS)
    h.add(2, 1000, START_NS)
    h.add(1, 1, START_NS + 20 * HOUR_NS)
    assert h.percentile(0.999) == 2
    assert h.percentile(1.0) == 3


def test_renormalisation_drops_old_buckets() -> None:
    h = DecayingHistogram(LIN10, HOUR_NS)
    h.add(2, 1, START_NS)
    h.add(1, 1, START_NS + 101 * HOUR_NS)
    assert h.percentile(1.0) == 2


def test_decayed_percentiles() -> None:
    h = DecayingHistogram(LIN10, HOUR_NS)
    for i in (1, 2, 3, 4):
        h.add(i, i, START_NS + (i - 1) * HOUR_NS)
    want = {0: 2, 0.02: 2, 0.03: 3, 0.10: 3, 0.11: 4, 0.34: 4, 0.35: 5, 1.0: 5}
    assert {p: h.percentile(p) for p in want} == want


def test_no_decay_at_one_time() -> None:
    h = DecayingHistogram(LIN10, HOUR_NS)
    for i in (1, 2, 3, 4):
        h.add(i, i, START_NS)
    want = {0: 2, 0.1: 2, 0.2: 3, 0.3: 3, 0.4: 4, 0.5: 4, 0.6: 4, 0.7: 5, 0.8: 5, 0.9: 5, 1.0: 5}
    assert {p: h.percentile(p) for p in want} == want


def test_load_takes_the_reference_time() -> None:
    ref = 1514862245 * 10**9  # 2018-01-02T03:04:05Z
    h = DecayingHistogram(LIN10, HOUR_NS)
    h.load(HistogramCheckpoint(ref, {0: 1}, 6.0))
    assert not h.empty
    assert h.reference_ns == ref
    assert h.save().reference_ns == ref


# -- the first sample's weight (docs/prediction.md, "Decay") -------------------------------------------------

T2026 = 1767225600 * 10**9  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("hour", "ref_hour", "weight"),
    [(5, 0, 1.33484), (6, 12, 0.70711), (7, 12, 0.74915), (18, 24, 0.70711)],
)
def test_first_sample_snaps_the_reference_from_year_one(hour: int, ref_hour: int, weight: float) -> None:
    h = DecayingHistogram(CPU_LAYOUT, 12 * HOUR_NS)
    h.add(1.0, 1.0, T2026 + hour * HOUR_NS)
    assert h.reference_ns == T2026 + ref_hour * HOUR_NS
    assert h.hist.total == pytest.approx(weight, abs=1e-5)


def test_rounding_to_a_half_life_counts_from_year_one() -> None:
    seven = 7 * HOUR_NS
    # 0001-01-01 → 1970-01-01 is 62135596800 s, not a multiple of 7 h: the grid is offset from Unix's
    offset = 62135596800 * 10**9 % seven
    t = T2026
    got = round_to_half_life(t, seven)
    assert (got + offset) % seven == 0 or (got + 62135596800 * 10**9) % seven == 0
    assert abs(got - t) <= seven // 2


def test_a_zero_only_histogram_predicts_the_first_bucket_end() -> None:
    """Zeros are not empty — 25 m and 5 MiB (docs/prediction.md, "Histogram" and "Zeros are not empty")."""
    cpu = DecayingHistogram(CPU_LAYOUT, 12 * HOUR_NS)
    mem = DecayingHistogram(MEMORY_LAYOUT, 24 * HOUR_NS)
    cpu.add(0.0, 1.0, T2026)
    mem.add(0.0, 1.0, T2026)
    assert int(cpu.percentile(0.95) * 1000) == 25
    assert int(mem.percentile(0.98)) == 5242880
