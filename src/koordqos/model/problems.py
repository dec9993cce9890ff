"""Malformed pod/node data: reported once per object and value (log + metric), never raised to callers."""

from __future__ import annotations

import structlog
from prometheus_client import Counter

from koordqos.observability import REGISTRY
from koordqos.once import SeenOnce

log = structlog.get_logger("koordqos.model")

MODEL_ERRORS = Counter(
    "koordqos_model_errors_total",
    "Malformed labels, annotations or quantities on pods and nodes (each object/value counted once)",
    ["kind", "field"],
    registry=REGISTRY,
)

# (kind, uid, field, value) already reported: digests only, in a table fixed at start (128 KiB), however
# many and however long the hostile values are; past 8,192 keys it forgets all at once
_SEEN: SeenOnce[tuple[str, str, str, str]] = SeenOnce(8192)


def field_label(field: str) -> str:
    """The metric label of a field: what a field names inside brackets is pod data (a container name in
    `containers[<name>].resources`) and is left out, so the label set stays the fixed set of fields."""
    start = field.find("[")
    if start < 0:
        return field
    return field[:start] + "[]" + field[field.rfind("]") + 1 :]


def report_problem(kind: str, uid: str, name: str, field: str, value: str, message: str) -> bool:
    """Log and count a malformed value once per (object uid, field, value); returns True when reported now."""
    if not _SEEN.first((kind, uid, field, value[:256])):
        return False
    MODEL_ERRORS.labels(kind, field_label(field)).inc()
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
