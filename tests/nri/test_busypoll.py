"""Busy-polling after a reply (nri/busypoll.py): how long a window lasts, what ends it, that the loop keeps
running everything else meanwhile, on both event loops, and that the plugin's setting reaches it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from koordqos.events.bus import EventBus
from koordqos.nri import metrics as m
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.busypoll import BusyPoll
from koordqos.nri.plugin import NRIPlugin
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_pod
from koordqos.testing.poll import wait_until

from .conftest import settings


def windows() -> tuple[float, float]:
    return m.BUSY_POLL_WINDOWS.labels("caught").get(), m.BUSY_POLL_WINDOWS.labels("expired").get()


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def on_loop(name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[name]) as runner:
        runner.run(main())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_window_without_a_request_lasts_its_length_then_expires(loop: str) -> None:
    async def main() -> None:
        poll = BusyPoll(0.02)
        caught, expired = windows()
        start = time.perf_counter()
        poll.replied()
        assert poll.polling
        await wait_until(lambda: windows()[1] == expired + 1, timeout=5, message="the window expired")
        assert time.perf_counter() - start >= 0.02
        assert not poll.polling  # no callback left turning the loop
        assert windows()[0] == caught

    on_loop(loop, main)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_loop_runs_timers_and_tasks_while_a_window_is_open(loop: str) -> None:
    async def main() -> None:
        poll = BusyPoll(5.0)
        poll.replied()
        start = time.perf_counter()
        fired = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.002, fired.set_result, None)
        await asyncio.wait_for(fired, 2.0)  # a timer fires
        await asyncio.wait_for(asyncio.create_task(asyncio.sleep(0.001)), 2.0)  # a task runs to its end
        assert time.perf_counter() - start < 5.0
        assert poll.polling  # ... and all of it while the window was still open
        poll.received()  # a request ends it
        await wait_until(lambda: not poll.polling, timeout=2, message="the window ended")

    on_loop(loop, main)


async def test_a_request_within_the_window_is_caught_and_ends_the_window() -> None:
    poll = BusyPoll(5.0)
    caught, expired = windows()
    poll.replied()
    await asyncio.sleep(0)  # one turn of the window
    poll.received()
    await wait_until(lambda: not poll.polling, timeout=2, message="the window ended")
    assert windows() == (caught + 1, expired)
    poll.received()  # a request after the window: nothing to catch
    assert windows() == (caught + 1, expired)


async def test_a_window_of_zero_is_off() -> None:
    poll = BusyPoll(0.0)
    before = windows()
    poll.replied()
    assert not poll.polling
    poll.received()
    assert windows() == before


async def test_replies_during_a_window_keep_one_window() -> None:
    poll = BusyPoll(0.02)
    caught, expired = windows()
    for _ in range(3):
        poll.replied()
    await wait_until(lambda: not poll.polling, timeout=5, message="the window ended")
    assert windows() == (caught, expired + 1)


async def test_a_closed_connection_stops_its_window() -> None:
    poll = BusyPoll(5.0)
    before = windows()
    poll.replied()
    poll.stop()
    await wait_until(lambda: not poll.polling, timeout=2, message="the window ended")
    assert windows() == before  # neither caught nor expired: ended
    poll.replied()
    assert not poll.polling  # and no new one starts


@pytest.mark.parametrize("window", [0.0, 0.01])
async def test_the_plugins_setting_reaches_its_connection(
    window: float, sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    """Each reply opens a window (caught by the next call, or expired) when the setting is on; off, none."""
    runtime = MockRuntime(sock_path, request_timeout=2.0)
    await runtime.start()
    try:
        plugin = start_plugin(settings(sock_path, busy_poll_seconds=window))
        await runtime.wait_joined(timeout=5)
        pod = sample_pod(3)
        await runtime.run_pod_sandbox(pod)
        session = plugin.session
        assert session is not None
        assert session.conn is not None
        busy = session.conn.busy_poll
        await wait_until(lambda: not busy.polling, timeout=2, message="no window open")
        caught, expired = windows()
        for j in range(5):
            await runtime.create_container(pod, sample_container(pod, j, api.CONTAINER_CREATED))
        await wait_until(lambda: not busy.polling, timeout=2, message="no window open")
        if window:
            # one window per reply, each caught by the next call or expired (which, depends on the load)
            assert sum(windows()) - caught - expired == 5
        else:
            assert windows() == (caught, expired)
    finally:
        await runtime.stop()
