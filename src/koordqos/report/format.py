"""Wire formats of the reported objects: Kubernetes quantities as koordlet prints them, Go durations and
RFC 3339 timestamps (docs/reporting.md, "Quantities", "Status fields")."""

from __future__ import annotations

from datetime import UTC, datetime

from koordqos.model.duration import go_duration, parse_go_duration

_BINARY = (
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
)
__all__ = [
    "cpu_quantity",
    "decimal_quantity",
    "go_duration",
    "memory_quantity",
    "parse_go_duration",
    "parse_rfc3339",
    "rfc3339",
]
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


def cpu_quantity(milli: int) -> str:
    """Millicores as koordlet's `NewMilliQuantity(m, DecimalSI)` prints them: `"1500m"`, whole cores `"2"`."""
    milli = max(int(milli), 0)
    if milli % 1000 == 0:
        return decimal_quantity(milli // 1000)
    return f"{milli}m"


def decimal_quantity(value: int) -> str:
    """An integer as canonical DecimalSI (`NewQuantity(v, DecimalSI)`): 3600 → `"3600"`, 23000 → `"23k"`."""
    value = int(value)
    if value == 0:
        return "0"
    for suffix, factor in _DECIMAL:
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def memory_quantity(value: int) -> str:
    """Bytes as canonical BinarySI: the largest power-of-1024 suffix dividing exactly, else the integer."""
    value = max(int(value), 0)
    if value == 0:
        return "0"
    for suffix, factor in _BINARY:
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def rfc3339(wall: float) -> str:
    """Unix time → `metav1.Time` text (UTC, second precision): `"2026-12-01T18:30:00Z"`."""
    return datetime.fromtimestamp(int(wall), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """`metav1.Time` text → unix time; ValueError when malformed."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
