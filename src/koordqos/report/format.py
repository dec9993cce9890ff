"""Wire formats of the reported objects: Kubernetes quantities as koordlet prints them, Go durations and
RFC 3339 timestamps (koordinator-reporting.md §1.3, §5.3)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_BINARY = (
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
)
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


def go_duration(seconds: float) -> str:
    """Seconds as Go's `time.Duration.String()` for whole seconds: 300 → `"5m0s"`, 3600 → `"1h0m0s"`."""
    total = round(seconds)
    if total == 0:
        return "0s"
    sign = "-" if total < 0 else ""
    total = abs(total)
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{sign}{h}h{m}m{s}s"
    if m:
        return f"{sign}{m}m{s}s"
    return f"{sign}{s}s"


_DUR_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DUR_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Go duration string (`"5m0s"`, `"1h30m"`, `"90s"`, `"0"`) → seconds; ValueError otherwise."""
    raw = text.strip()
    if raw in ("0", "+0", "-0"):
        return 0.0
    sign = -1.0 if raw.startswith("-") else 1.0
    body = raw.lstrip("+-")
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    pos = 0
    total = 0.0
    for m in _DUR_PART.finditer(body):
        if m.start() != pos:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _DUR_UNIT[m.group(2)]
        pos = m.end()
    if pos != len(body):
        raise ValueError(f"invalid duration {text!r}")
    return sign * total


def rfc3339(wall: float) -> str:
    """Unix time → `metav1.Time` text (UTC, second precision): `"2026-12-01T18:30:00Z"`."""
    return datetime.fromtimestamp(int(wall), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """`metav1.Time` text → unix time; ValueError when malformed."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
