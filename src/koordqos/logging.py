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
    # libraries log through the standard library (kubernetes-asyncio, aiohttp, asyncio): in the JSON format
    # their lines are JSON objects too, with the logger's name, never plain text among the JSON lines
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=[
                    structlog.stdlib.add_logger_name,
                    structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                ],
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.dict_tracebacks,
                    structlog.processors.JSONRenderer(),
                ],
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root = logging.getLogger()
    for old in root.handlers[:]:
        if getattr(old, "_koordqos", False):
            root.removeHandler(old)
    handler._koordqos = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(max(lvl, logging.WARNING))
