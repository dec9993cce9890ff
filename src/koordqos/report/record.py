"""What the reporter components share: `ReportRecord` (a reporter's last round, for /debug/state) and
`report_invalid_fields` (a rejected field of an API object the reporters read: logged and counted once)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.model.wirevalue import FieldProblem

log = structlog.get_logger("koordqos.report")
Json = dict[str, Any]
Sleep = Callable[[float], Awaitable[None]]
INVALID_FIELDS = Counter(
    "koordqos_report_invalid_fields_total",
    "Fields of API objects the reporters read that were rejected (NaN, infinite, out of range, wrong type): "
    "the last valid value or the default kept; each problem counted when it appears",
    ["kind"],
    registry=obs.REGISTRY,
)


def report_invalid_fields(
    kind: str, problems: tuple[FieldProblem, ...], before: frozenset[tuple[str, str, str]], **context: object
) -> frozenset[tuple[str, str, str]]:
    """Log and count the problems not already in `before` (the last object's); returns this object's set, so a
    re-read of the same object repeats nothing and the same bad value after a valid one is reported again."""
    for problem in problems:
        if problem.key not in before:
            INVALID_FIELDS.labels(kind).inc()
            obs.ERRORS.labels("report", "invalid-field").inc()
            log.error(
                f"{kind} field rejected; keeping its last valid value", problem=problem.describe(), **context
            )
    return frozenset(p.key for p in problems)


@dataclass(frozen=True, slots=True)
class ReportRecord:
    """The last round of a reporter, for /debug/state."""

    built_at: str  # RFC 3339
    outcome: str
    detail: str = ""
    written_at: str = ""  # RFC 3339 of the last successful write
    body: Json | None = None
