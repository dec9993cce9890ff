"""Wait for a condition by polling it against a deadline: the one way tests and benchmarks synchronise.

A test never sleeps a fixed time to let something happen; it polls the condition it needs and fails with
a message naming that condition when the deadline passes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT = 5.0
DEFAULT_INTERVAL = 0.005


class ConditionTimeout(AssertionError):
    """The condition did not hold before the deadline (an AssertionError: pytest reports a failure)."""


#: what a wait names: a text, or a function giving it when the wait times out (so that it shows the values
#: the condition saw last, not those at the start of the wait)
Message = str | Callable[[], str]


def _timed_out(message: Message, timeout: float) -> ConditionTimeout:
    text = message() if callable(message) else message
    return ConditionTimeout(f"timed out after {timeout:g} s waiting for {text}")


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: Message = "condition",
) -> None:
    """Return as soon as `predicate()` is true (it may be a coroutine function), checking every `interval`
    seconds on the running loop; raise ConditionTimeout naming `message` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() >= end:
            raise _timed_out(message, timeout)
        await asyncio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], bool],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: Message = "condition",
) -> None:
    """`wait_until` for code without an event loop (a thread or a subprocess does the work)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            raise _timed_out(message, timeout)
        time.sleep(interval)
