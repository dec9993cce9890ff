"""Malformed pod/node data: reported once per object and value (log + metric), never raised to callers."""

from __future__ import annotations

from collections import OrderedDict

import structlog
from prometheus_client import Counter

from koordqos.observability import REGISTRY

log = structlog.get_logger("koordqos.model")

MODEL_ERRORS = Counter(
    "koordqos_model_errors_total",
    "Malformed labels, annotations or quantities on pods and nodes (each object/value counted once)",
    ["kind", "field"],
    registry=REGISTRY,
)

_SEEN: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
_SEEN_MAX = 8192


def report_problem(kind: str, uid: str, name: str, field: str, value: str, message: str) -> bool:
    """Log and count a malformed value once per (object uid, field, value); returns True when reported now."""
    key = (kind, uid, field, value[:256])
    if key in _SEEN:
        _SEEN.move_to_end(key)
        return False
    _SEEN[key] = None
    if len(_SEEN) > _SEEN_MAX:
        _SEEN.popitem(last=False)
    MODEL_ERRORS.labels(kind, field).inc()
    log.warning(
        "malformed value ignored",
        kind=kind,
        object=name,
        uid=uid,
        field=field,
        value=value[:256],
        error=message,
    )
    return True


def forget_problems() -> None:
    """Clear the reported set (tests)."""
    _SEEN.clear()
