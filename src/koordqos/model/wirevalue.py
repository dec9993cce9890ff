"""Numbers read from API objects, checked as Koordinator's CRDs and Go's decoding would (issue #39).

JSON from the API server reaches the agent through Python's `json`, which accepts what no Kubernetes API
server sends: `NaN`, `Infinity`, `1e400` (read as infinity) and integers of any size. Go's decoding refuses
them, so koordlet never sees them; here every reader of such a field goes through these checks, and a value
that fails is a `FieldProblem` (path, value, rule): the caller keeps the field's last valid value or its
default, logs the problem once and counts it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1
#: the longest Go `time.Duration` in whole seconds: koordlet multiplies seconds fields by `time.Second`
MAX_DURATION_SECONDS: Final = INT64_MAX // 1_000_000_000


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One rejected field: `spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: out of range: 150
    (valid: [0, 100])`."""

    path: str  # wire names, `spec.` first for an object
    what: str  # "out of range", "wrong type", "unknown value", "missing"
    value: str  # the value as JSON (shortened); "" when missing
    valid: str  # the rule

    def describe(self) -> str:
        """`<path>: <what>: <value> (valid: <rule>)`."""
        got = f": {self.value}" if self.value else ""
        return f"{self.path}: {self.what}{got} (valid: {self.valid})"

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes two problems the same (a relist of the same object repeats it)."""
        return (self.path, self.value, self.valid)


def short(value: Any) -> str:
    """A value as shortened JSON (`150`, `"65"`, `NaN`, `{"a": 1}`)."""
    try:
        text = json.dumps(value, default=str)
    except ValueError:  # an integer past Python's digit limit, a circular structure: never raise on data
        bits = value.bit_length() if isinstance(value, int) else 0
        text = f"<an integer of {bits} bits>" if bits else f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def json_integer(value: Any, path: str, low: int, high: int) -> int | FieldProblem:
    """A JSON integer in [low, high] (an integral float such as `300.0` counts, as the API server's
    schema validation lets it through); a problem for NaN, ±Inf, fractions, other types or a value out of
    range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return FieldProblem(path, "wrong type", short(value), "an integer")
    number: int
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return FieldProblem(path, "wrong type", short(value), "an integer")
        number = int(value)
    else:
        number = value
    if not low <= number <= high:
        return FieldProblem(path, "out of range", short(number), f"[{low}, {high}]")
    return number
