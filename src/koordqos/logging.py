"""structlog set-up: JSON in production, console on a TTY; context via contextvars."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog and stdlib logging once for the process (output on stderr)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer: Any = (
        # plain tracebacks: rich's (the default when rich is installed) cost ~100 ms each on the loop
        structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if fmt == "json":
        processors.append(structlog.processors.dict_tracebacks)
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(name)s: %(message)s")
