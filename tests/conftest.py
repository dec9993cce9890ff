"""Suite-wide set-up: structlog's default console renderer with plain tracebacks.

structlog's default renders exceptions with rich when rich is installed (the demo extra brings it); that
costs ~100 ms per logged exception and turns crash-loop tests into timing tests on a loaded machine.
"""

from __future__ import annotations

import structlog

structlog.configure(
    processors=[
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.StackInfoRenderer(),
        structlog.dev.set_exc_info,
        structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
        structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback),
    ]
)
