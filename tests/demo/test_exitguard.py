"""The demo's exit guard: undo steps run once, newest first, also on a signal."""

from __future__ import annotations

import asyncio
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


async def _signal_lands_in_a_side_task(ran: list[str]) -> None:
    """The main coroutine waits; a busy side task is what runs when SIGTERM is handled (the demo's probe
    readers under load)."""

    async def busy() -> None:
        ran.append("busy")
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # Python handlers run between bytecodes: here, in this task
            pass
        ran.append("busy done")

    side = asyncio.create_task(busy())
    try:
        async with asyncio.timeout(20):  # a failure detector only: interrupted, this ends at once
            await asyncio.Event().wait()
    finally:
        side.cancel()
        await asyncio.gather(side, return_exceptions=True)


def test_a_signal_while_a_side_task_runs_still_interrupts_the_main_task() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    ran: list[str] = []
    with pytest.raises(Interrupted) as info, ExitGuard() as guard:
        asyncio.run(guard.interruptible(_signal_lands_in_a_side_task(ran)))
    assert info.value.signum == signal.SIGTERM
    assert ran == ["busy", "busy done"]  # the side task was not the one interrupted
    assert signal.getsignal(signal.SIGTERM) == previous


def _signal_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()  # not reached: the handler raises first


def test_after_the_loop_the_guards_own_handler_is_back() -> None:
    async def nothing() -> int:
        return 7

    with ExitGuard() as guard:
        assert asyncio.run(guard.interruptible(nothing())) == 7
        assert signal.getsignal(signal.SIGTERM) == guard._on_signal
        with pytest.raises(Interrupted):
            _signal_self()
