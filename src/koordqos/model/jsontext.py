"""JSON text from pod and node data (annotations) → a value, failing only with ValueError.

`json.loads` raises `RecursionError` for ~1 KB of nested brackets (and, on pathological input, other
errors); callers of annotation parsers catch `ValueError`, so an uncaught `RecursionError` from one pod's
annotation used to abort whole reconcile passes and drop the pod in cluster mode. Every annotation JSON goes
through `loads` instead: one failure type for any text.

Numbers are read as Go's `encoding/json` reads them (issue #39): `NaN`, `Infinity` and `-Infinity` are not
JSON, and a number beyond float64 (`1e400`) is an error, not infinity; so no annotation yields a value
koordlet could never have seen.
"""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn


class JSONTextError(ValueError):
    """The text is not JSON this agent can read (syntax, nesting too deep, numbers too long)."""


def _constant(name: str) -> NoReturn:
    raise JSONTextError(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONTextError(f"number out of range: {text[:40]}")
    return value


def loads(raw: str | bytes) -> Any:
    """Parse `raw` as JSON; JSONTextError (a ValueError) on any failure."""
    try:
        return json.loads(raw, parse_constant=_constant, parse_float=_float)
    except ValueError as exc:
        raise JSONTextError(str(exc)) from None
    except RecursionError:
        raise JSONTextError("nested too deeply") from None
    except Exception as exc:  # any other decoder failure: the text is unusable, never the caller's crash
        raise JSONTextError(f"{type(exc).__name__}: {exc}") from None
