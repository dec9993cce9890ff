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
from koordqos.events.types import MetricTick
from koordqos.metrics.types import MetricSnapshot, NodeSample
from koordqos.nri import metrics as m
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.busypoll import BusyPoll, spare_cpu
from koordqos.nri.plugin import NRIPlugin
from koordqos.state import NodeState, reduce
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_pod
from koordqos.testing.poll import wait_until

from .conftest import settings


def windows() -> tuple[float, float]:
    return m.BUSY_POLL_WINDOWS.labels("caught").get(), m.BUSY_POLL_WINDOWS.labels("expired").get()


def skipped() -> float:
    return m.BUSY_POLL_WINDOWS.labels("skipped").get()


def round_with(cores: float | None, cpus: int) -> MetricTick:
    """A metrics round that saw `cores` of the node's `cpus` in use."""
    sample = MetricSnapshot(at=1.0, interval=1.0, node=NodeSample(cpu_usage_cores=cores, cpu_count=cpus))
    return MetricTick(at=1.0, sample=sample)


def with_usage(cores: float | None, cpus: int) -> NodeState:
    return reduce(NodeState(), round_with(cores, cpus))


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


@pytest.mark.parametrize(
    ("cores", "cpus", "spare"),
    [
        (0.5, 2, True),
        (1.0, 2, True),
        (1.5, 2, False),
        (2.0, 2, False),
        (60.0, 64, True),
        (None, 2, True),
        (0.5, 0, True),
    ],
)
def test_spare_cpu_means_a_core_idle_in_the_last_round(cores: float | None, cpus: int, spare: bool) -> None:
    assert spare_cpu(with_usage(cores, cpus)) is spare


def test_spare_cpu_before_the_first_round() -> None:
    assert spare_cpu(NodeState()) is True
    assert spare_cpu(reduce(NodeState(), MetricTick(at=1.0, sample=None))) is True


async def test_a_closed_gate_opens_no_window_and_counts_it() -> None:
    open_gate = False
    poll = BusyPoll(5.0, gate=lambda: open_gate)
    before, skips = windows(), skipped()
    poll.replied()
    assert not poll.polling
    assert skipped() == skips + 1
    open_gate = True
    poll.replied()
    assert poll.polling
    poll.stop()
    await wait_until(lambda: not poll.polling, timeout=2, message="the window ended")
    assert windows() == before
    assert skipped() == skips + 1


@pytest.mark.parametrize(("window", "busy_node"), [(0.0, False), (0.01, False), (0.01, True)])
async def test_the_plugins_setting_reaches_its_connection(
    window: float, busy_node: bool, sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    """Each reply opens a window (caught by the next call, or expired) when the setting is on and the node
    has a core idle; off, none; on a busy node each reply counts as skipped instead."""
    if busy_node:
        bus.publish_nowait(round_with(1.8, 2))
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
        skips = skipped()
        for j in range(5):
            await runtime.create_container(pod, sample_container(pod, j, api.CONTAINER_CREATED))
        await wait_until(lambda: not busy.polling, timeout=2, message="no window open")
        if busy_node:
            assert windows() == (caught, expired)
            assert skipped() - skips == 5
        elif window:
            # one window per reply, each caught by the next call or expired (which, depends on the load)
            assert sum(windows()) - caught - expired == 5
        else:
            assert windows() == (caught, expired)
    finally:
        await runtime.stop()
