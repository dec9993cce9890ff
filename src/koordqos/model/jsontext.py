"""JSON text from pod and node data (annotations) → a value, failing only with ValueError.

`json.loads` raises `RecursionError` for ~1 KB of nested brackets (and, on pathological input, other
errors); callers of annotation parsers catch `ValueError`, so an uncaught `RecursionError` from one pod's
annotation used to abort whole reconcile passes and drop the pod in cluster mode. Every annotation JSON goes
through `loads` instead: one failure type for any text.
"""

from __future__ import annotations

import json
from typing import Any


class JSONTextError(ValueError):
    """The text is not JSON this agent can read (syntax, nesting too deep, numbers too long)."""


def loads(raw: str | bytes) -> Any:
    """Parse `raw` as JSON; JSONTextError (a ValueError) on any failure."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise JSONTextError(str(exc)) from None
    except RecursionError:
        raise JSONTextError("nested too deeply") from None
    except Exception as exc:  # any other decoder failure: the text is unusable, never the caller's crash
        raise JSONTextError(f"{type(exc).__name__}: {exc}") from None
