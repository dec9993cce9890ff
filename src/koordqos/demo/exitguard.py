"""Cleanup that runs exactly once: on normal exit, on an exception, on Ctrl-C, SIGTERM or SIGHUP.

The demo registers undo steps (kill the workload, stop the agent, remove the scratch cgroups) as it makes
things; `ExitGuard` runs them newest first from whichever of `close()`, the `atexit` hook or a signal
handler comes first. A failing step is reported and the others still run. (A SIGKILL cannot be caught:
the workload then exits on its own when its stdin closes, and the scratch tree keeps its unique name so it
can be found and removed.)

While an asyncio loop runs, a Python signal handler that raises is not enough: the exception is raised in
whatever bytecode runs when the signal is handled, and if that is a callback or a side task (the probes'
output readers, busy under load), asyncio swallows it (a logged callback error, a failed task nobody awaits)
and the demo carries on to the end of its phases. `interruptible()` therefore takes the signals over for the
loop's lifetime (`loop.add_signal_handler`: handled as a loop callback) and cancels the main task, which
then raises `Interrupted` where it awaits; the guard's own handlers are put back afterwards.
"""

from __future__ import annotations

import asyncio
import atexit
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """A termination signal arrived; raised in the main thread so the demo unwinds through its finally."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class ExitGuard:
    """A stack of undo steps run once (see the module docstring)."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[[], object]]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._previous: dict[int, object] = {}
        self.errors: list[str] = []

    def __enter__(self) -> ExitGuard:
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def push(self, what: str, step: Callable[[], object]) -> None:
        """Register an undo step (`what` names it in error reports)."""
        with self._lock:
            self._steps.append((what, step))

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # unwind the main thread (its finally blocks and close() run); a second signal is ignored there
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    async def interruptible(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` in this task; a termination signal meanwhile cancels it and raises `Interrupted`
        here (see the module docstring). Further signals are ignored, as after the guard's own handler."""
        if threading.current_thread() is not threading.main_thread():
            return await coro
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        got: list[int] = []

        def on_signal(signum: int) -> None:
            if not got:
                got.append(signum)
                task.cancel()

        for sig in _SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await coro
        except asyncio.CancelledError:
            if got:
                raise Interrupted(got[0]) from None
            raise
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
                # back to the guard's handler, or ignored once interrupted (cleanup must not be cut short)
                signal.signal(sig, signal.SIG_IGN if got else self._on_signal)

    def close(self) -> None:
        """Run every registered step once, newest first; restore the signal handlers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            steps, self._steps = self._steps, []
        for what, step in reversed(steps):
            try:
                step()
            except Exception as exc:  # keep going: the next step may be the one that removes the cgroups
                msg = f"cleanup: {what} failed: {exc}"
                self.errors.append(msg)
                print(msg, file=sys.stderr)
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)  # type: ignore[arg-type]
        atexit.unregister(self.close)
