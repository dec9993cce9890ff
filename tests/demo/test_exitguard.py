"""The demo's exit guard: undo steps run once, newest first, also on a signal."""

from __future__ import annotations

import os
import signal

import pytest

from koordqos.demo.exitguard import ExitGuard, Interrupted


def test_exit_guard_runs_each_step_once_newest_first_despite_failures() -> None:
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise OSError("busy")

    with ExitGuard() as guard:
        guard.push("first", lambda: ran.append("first"))
        guard.push("boom", boom)
        guard.push("last", lambda: ran.append("last"))
    guard.close()
    assert ran == ["last", "boom", "first"]
    assert guard.errors == ["cleanup: boom failed: busy"]


def test_exit_guard_turns_a_signal_into_an_exception_and_restores_handlers() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    ran: list[str] = []
    guard = ExitGuard()
    guard.push("step", lambda: ran.append("step"))

    def interrupted_run() -> None:
        with guard:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # not reached: the handler raises first

    with pytest.raises(Interrupted) as info:
        interrupted_run()
    assert info.value.signum == signal.SIGTERM
    assert ran == ["step"]
    assert signal.getsignal(signal.SIGTERM) == previous
