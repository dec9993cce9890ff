"""ExitDeadline: the agent process ends a bounded time after its stop began, whatever still runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading

import structlog

log = structlog.get_logger("koordqos.agent")


# The stop, bounded (see `Agent._run_components` and `ExitDeadline`): a component still running is cancelled
# again this often until the shutdown timeout (a cancellation can be lost: `asyncio.wait_for` on Python
# 3.11 drops it when its awaitable completes in the same loop step), and the agent process ends this long
# after the shutdown timeout whatever still runs.
RECANCEL_SECONDS = 1.0
EXIT_GRACE_SECONDS = 2.0


class ExitDeadline:
    """Ends the agent process `seconds` after the stop began if it has not exited by then.

    What the loop cannot bound: a task that ignores every cancellation (the TaskGroup waits for it), a
    worker thread stuck in a system call (`asyncio.Runner` waits for the default executor at close, and the
    interpreter for its threads at exit). A daemon thread's timer logs one error line naming what still
    ran, and exits with code 1. Armed by `run` only: an agent run inside a test process has none.
    """

    EXIT_CODE = 1

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.still_running: list[str] = []  # the components the stop waits for (updated by the loop)
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        """Start the countdown (once)."""
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.name = "koordqos-exit-deadline"
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        threads = [
            t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()
        ]
        log.error(
            "the agent did not exit within its shutdown timeout; exiting",
            after_s=round(self.seconds, 2),
            components=self.still_running,
            threads=threads,
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(self.EXIT_CODE)


async def cancel_until(
    exit_deadline: ExitDeadline | None, tasks: set[asyncio.Task[None]], deadline: float
) -> set[asyncio.Task[None]]:
    """Cancel `tasks`, again every RECANCEL_SECONDS while any still runs, until `deadline` (loop time);
    returns those still running then (and keeps `exit_deadline` told which they are). One cancellation can
    be lost (see RECANCEL_SECONDS)."""
    loop = asyncio.get_running_loop()
    pending = tasks
    while pending and loop.time() < deadline:
        for t in pending:
            t.cancel()
        if exit_deadline is not None:
            exit_deadline.still_running = sorted(t.get_name() for t in pending)
        wait = min(RECANCEL_SECONDS, deadline - loop.time())
        _done, pending = await asyncio.wait(pending, timeout=max(0.0, wait))
    if exit_deadline is not None:
        exit_deadline.still_running = sorted(t.get_name() for t in pending)
    return pending
