"""The event loop the agent process runs on (`--event-loop`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from koordqos.errors import ConfigError


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop to run on: uvloop when chosen, or with `auto` when it can be imported (a dependency of
    koordqos; an install without it runs the stdlib loop); None means the stdlib loop. Measured in
    docs/performance.md (NRI)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop
