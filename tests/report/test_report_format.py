"""Wire formats and window statistics of the report (docs/reporting.md, "Quantities", "Status fields" and
"Percentile index")."""

from __future__ import annotations

import pytest

from koordqos.model.quantity import to_int, to_milli
from koordqos.report.format import (
    cpu_quantity,
    decimal_quantity,
    go_duration,
    memory_quantity,
    parse_go_duration,
    parse_rfc3339,
    rfc3339,
)
from koordqos.report.stats import in_cold_start, koord_percentile, window_statistics


@pytest.mark.parametrize(
    ("milli", "text"), [(1200, "1200m"), (1500, "1500m"), (2000, "2"), (0, "0"), (8000, "8"), (1, "1m")]
)
def test_cpu_quantity_is_koordlet_canonical(milli: int, text: str) -> None:
    assert cpu_quantity(milli) == text
    assert to_milli(text) == milli


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (4 << 30, "4Gi"),
        (16375892 * 1024, "16375892Ki"),
        (1536 << 20, "1536Mi"),
        (30709016167, "30709016167"),
        (13 << 30, "13Gi"),
        (0, "0"),
        (1023, "1023"),
    ],
)
def test_memory_quantity_is_binary_si_canonical(value: int, text: str) -> None:
    assert memory_quantity(value) == text
    assert to_int(text) == value


def test_decimal_quantity_for_batch_cpu() -> None:
    assert decimal_quantity(3600) == "3600"
    assert decimal_quantity(23000) == "23k"
    assert decimal_quantity(0) == "0"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(300, "5m0s"), (600, "10m0s"), (1800, "30m0s"), (3600, "1h0m0s"), (90, "1m30s"), (30, "30s")],
)
def test_go_duration_round_trip(seconds: int, text: str) -> None:
    assert go_duration(seconds) == text
    assert parse_go_duration(text) == seconds


@pytest.mark.parametrize("text", ["5m", "1h30m", "1.5h", "500ms", "0"])
def test_go_duration_parses_other_forms(text: str) -> None:
    assert parse_go_duration(text) >= 0


@pytest.mark.parametrize("text", ["", "5", "m", "5x", "1h 2m", "-"])
def test_go_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


def test_rfc3339_second_precision_utc() -> None:
    assert rfc3339(1796149800.9) == "2026-12-01T18:30:00Z"
    assert parse_rfc3339("2026-12-01T18:30:00Z") == 1796149800


def test_percentile_index_rule_is_koordlets() -> None:
    values = [float(v) for v in range(1, 11)]  # n = 10
    assert koord_percentile(values, 0.95) == 9.0  # index floor(9.5) - 1 = 8 → the 9th smallest
    assert koord_percentile(values, 0.50) == 5.0  # index 4
    assert koord_percentile(values, 0.90) == 9.0  # index 8
    assert koord_percentile(values, 0.99) == 9.0
    assert koord_percentile([7.0], 0.5) == 7.0  # index max(0, -1)
    with pytest.raises(ValueError, match="no samples"):
        koord_percentile([], 0.5)


def test_window_statistics() -> None:
    stats = window_statistics([4.0, 1.0, 3.0, 2.0])
    # n = 4: p50 → index 1, p90/p95/p99 → index floor(3.6..3.96) - 1 = 2
    assert stats == {"avg": 2.5, "p50": 2.0, "p90": 3.0, "p95": 3.0, "p99": 3.0}
    assert window_statistics([]) is None


def test_cold_start_needs_half_the_duration() -> None:
    assert in_cold_start(0.0, 149.0, 300.0)
    assert not in_cold_start(0.0, 150.0, 300.0)
    assert in_cold_start(None, None, 300.0)
