"""Go `time.Duration` text: `5m0s`, `1h30m`, `500ms` (NodeMetric durations, koordlet-style flags)."""

from __future__ import annotations

import re


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
