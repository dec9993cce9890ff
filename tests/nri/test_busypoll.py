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
from structlog.testing import capture_logs

from koordqos.bus import EventBus
from koordqos.config import AgentConfig
from koordqos.events.types import MetricTick
from koordqos.metrics.types import MetricSnapshot, NodeSample
from koordqos.nri import build_plugin
from koordqos.nri import telemetry as m
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.busypoll import BusyPoll, SpareCPU, spare_cpu
from koordqos.nri.plugin import NRIPlugin
from koordqos.nri.session import no_hooks
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


@pytest.mark.parametrize(
    ("window", "busy_node", "seen_in"),
    [(0.0, False, "metrics"), (0.01, False, "metrics"), (0.01, True, "metrics"), (0.01, True, "stat")],
)
async def test_the_plugins_setting_reaches_its_connection(
    window: float,
    busy_node: bool,
    seen_in: str,
    sock_path: Path,
    start_plugin: Callable[..., NRIPlugin],
    bus: EventBus,
    tmp_path: Path,
) -> None:
    """Each reply opens a window (caught by the next call, or expired) when the setting is on and the node
    has a core idle; off, none; on a busy node — seen in the metrics round (the default gate) or in the
    proc root's stat (the agent's SpareCPU) — each reply counts as skipped instead."""
    kw: dict[str, Any] = {}
    if busy_node and seen_in == "metrics":
        bus.publish_nowait(round_with(1.8, 2))
    elif busy_node:
        stat = tmp_path / "stat"
        stat.write_text(stat_text(1000, 1000))
        # (own CPU held at 0: the mock runtime shares this process's CPU)
        kw["busy_poll_gate"] = gate = SpareCPU(stat, period=0.0, own_cpu=lambda: 0.0)
        gate()  # the first sample
        stat.write_text(stat_text(1000 + 10_000, 1000))  # busy since
    runtime = MockRuntime(sock_path, request_timeout=2.0)
    await runtime.start()
    try:
        plugin = start_plugin(settings(sock_path, busy_poll_seconds=window), **kw)
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


# -- SpareCPU: the gate the agent passes, on the proc root's stat ------------------------------------


def stat_text(busy: int, idle: int, cpus: int = 2) -> str:
    """A /proc/stat whose aggregate line has `busy` ticks (user) and `idle` ticks, with `cpus` cpuN lines."""
    lines = [f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0"]
    lines += [f"cpu{i} {busy // cpus} 0 0 {idle // cpus} 0 0 0 0 0 0" for i in range(cpus)]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 99", ""])


class FakeNode:
    """A stat file, a clock and this process's CPU time, all moved by the test."""

    def __init__(self, cpus: int = 2) -> None:
        self.cpus = cpus
        self.busy = 1000
        self.idle = 1000
        self.now = 100.0
        self.own = 5.0
        self.reads = 0
        self.missing = False
        self.text: str | None = None  # when set, read instead of the ticks

    def read(self, path: Path) -> str | None:
        self.reads += 1
        if self.missing:
            return None  # as `procfs.read_text` on a missing or unreadable file
        return self.text if self.text is not None else stat_text(self.busy, self.idle, self.cpus)

    def run(self, seconds: float, others: float, own: float = 0.0) -> None:
        """`seconds` pass with `others` cores used by other processes and `own` by this one (100 ticks/s)."""
        used = others + own
        self.busy += round(used * seconds * 100)
        self.idle += round(max(self.cpus - used, 0.0) * seconds * 100)
        self.own += own * seconds
        self.now += seconds

    def gate(self, fallback: Callable[[], bool] | None = None) -> SpareCPU:
        return SpareCPU(
            Path("/synthetic/proc/stat"),
            fallback,
            clock=lambda: self.now,
            own_cpu=lambda: self.own,
            read=self.read,
        )


def test_spare_cpu_is_closed_until_two_samples_a_period_apart() -> None:
    node = FakeNode()
    gate = node.gate()
    assert node.reads == 0  # nothing read at construction: the agent's start-up stays out of the window
    assert gate() is False  # the first sample: nothing known yet
    node.run(0.05, others=0.0)
    assert gate() is False  # within the period: not read again
    assert node.reads == 1
    node.run(0.06, others=0.0)
    assert gate() is True  # an idle node, 0.11 s later
    assert node.reads == 2


@pytest.mark.parametrize(
    ("cpus", "others", "own", "spare"),
    [
        (2, 0.0, 0.0, True),
        (2, 0.9, 0.0, True),  # 1.1 cores idle
        (2, 1.4, 0.0, False),  # two busy processes at 70 %: 0.6 idle
        (2, 0.8, 0.6, True),  # 0.6 idle, and the agent's own calls and polling (0.6) count as spare
        (2, 1.4, 0.6, False),  # the node is full and others use 1.4 of it: 0.6 is not a core
        (2, 2.0, 0.0, False),
        (2, 0.9, 1.1, True),  # the node is full, but 1.1 cores of it are ours
        (64, 62.5, 0.0, True),
        (64, 63.5, 0.0, False),
    ],
)
def test_spare_cpu_counts_idle_cores_and_this_process_own(
    cpus: int, others: float, own: float, spare: bool
) -> None:
    node = FakeNode(cpus)
    gate = node.gate()
    gate()
    node.run(0.2, others=others, own=own)
    assert gate() is spare


def test_spare_cpu_follows_the_node_as_it_gets_busy_and_quiet_again() -> None:
    node = FakeNode()
    gate = node.gate()
    gate()
    verdicts = []
    for others in (0.2, 0.2, 1.8, 1.8, 0.3):
        node.run(0.15, others=others)
        verdicts.append(gate())
    assert verdicts == [True, True, False, False, True]


def test_spare_cpu_keeps_its_verdict_and_base_while_the_stat_does_not_change() -> None:
    node = FakeNode()
    gate = node.gate()
    gate()
    node.run(0.15, others=0.0)
    assert gate() is True
    # the file is copied every 0.2 s (a synthetic root): a read in between sees the same ticks
    node.now += 0.15
    node.own += 0.15
    assert gate() is True
    reads = node.reads
    # the next change spans 0.3 s of a busy node since the base sample
    node.run(0.2, others=2.0)
    assert gate() is False
    assert node.reads == reads + 1


def test_spare_cpu_starts_over_when_the_counters_go_backwards() -> None:
    node = FakeNode()
    gate = node.gate()
    gate()
    node.run(0.15, others=0.0)
    assert gate() is True
    # another stat at that path, with smaller counters (and a busy node from here on)
    node.busy, node.idle = 10, 10
    node.run(0.15, others=2.0)
    assert gate() is True  # no window to judge from: the verdict stands, a new base is taken
    node.run(0.15, others=2.0)
    assert gate() is False  # judged from the new base, not stuck on the old one


def test_spare_cpu_reads_at_most_once_a_period() -> None:
    node = FakeNode()
    gate = node.gate()
    for _ in range(1000):  # a burst of replies 50 µs apart
        gate()
        node.run(0.00005, others=0.0)
    assert node.reads == 1  # 50 ms in all: one read
    node.run(0.06, others=0.0)
    gate()
    assert node.reads == 2


@pytest.mark.parametrize(
    ("fault", "error"), [("missing", "unreadable"), ("garbage", "no well-formed cpu line")]
)
def test_an_unreadable_stat_falls_back_logged_and_counted_once(fault: str, error: str) -> None:
    node = FakeNode()
    fallback_says = False
    gate = node.gate(fallback=lambda: fallback_says)
    errors = m.BUSY_POLL_GATE_ERRORS._value.get()
    if fault == "garbage":
        node.text = "cpu  not numbers\n"
    else:
        node.missing = True
    with capture_logs() as logs:
        for _ in range(3):
            assert gate() is False  # the fallback's answer
            node.run(0.2, others=0.0)
        fallback_says = True
        assert gate() is True
    assert m.BUSY_POLL_GATE_ERRORS._value.get() == errors + 1
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["path"] == "/synthetic/proc/stat"
    assert "cannot read the node's CPU" in warnings[0]["event"]
    assert warnings[0]["error"] == error
    # readable again: the stat decides (closed until two samples, then a busy node says no)
    node.missing = False
    node.text = None
    fallback_says = True
    node.run(0.2, others=2.0)
    gate()
    node.run(0.2, others=2.0)
    assert gate() is False


def test_a_missing_stat_file_falls_back(tmp_path: Path) -> None:
    """Through the default reader (`procfs.read_text`): a proc root without `stat`."""
    gate = SpareCPU(tmp_path / "stat", fallback=lambda: False)
    assert gate() is False
    (tmp_path / "stat").write_text(stat_text(1000, 1000))
    gate._read_at = None  # the next call reads again
    assert gate() is False  # readable now: closed until two samples
    assert gate._base is not None


def test_a_connections_window_primes_its_gate_as_it_opens() -> None:
    node = FakeNode()
    gate = node.gate()
    BusyPoll(0.0, gate=gate)
    assert node.reads == 0  # polling off: the gate is never asked
    BusyPoll(0.0001, gate=gate)
    assert node.reads == 1  # the first sample, as the connection opens
    node.run(0.15, others=0.0)
    assert gate() is True  # so the first reply 0.1 s later already has a verdict
    assert node.reads == 2


def test_an_unreadable_stat_without_a_fallback_leaves_the_gate_open() -> None:
    node = FakeNode()
    node.missing = True
    assert node.gate()() is True  # as `spare_cpu` without metrics: a window's cost is bounded


async def test_spare_cpu_on_the_real_proc_stat() -> None:
    """Two real samples give a verdict (which one depends on this machine's load)."""
    gate = SpareCPU(Path("/proc/stat"), period=0.0)
    assert gate() is False
    first = gate._base
    assert first is not None

    def ticked() -> bool:  # the kernel's tick moved the totals on: a second sample makes a window
        gate()
        return gate._base is not None and gate._base[1] > first[1]

    await wait_until(ticked, timeout=5, message="/proc/stat ticked")
    assert gate._base is not None
    verdict = gate()
    assert isinstance(verdict, bool)
    assert verdict is gate._verdict


@pytest.mark.parametrize(("window", "gated"), [(0.0001, True), (0.0, False)])
def test_the_agents_plugin_gates_on_its_proc_root(window: float, gated: bool, tmp_path: Path) -> None:
    """build_plugin gives the plugin a SpareCPU on the configured proc root (none when polling is off)."""
    (tmp_path / "stat").write_text(stat_text(1000, 1000))
    config = AgentConfig.model_validate(
        {
            "paths": {"proc_root": str(tmp_path)},
            "nri": {"socket": str(tmp_path / "nri.sock"), "busy_poll_seconds": window},
        }
    )
    plugin = build_plugin(EventBus(), config, no_hooks, {})
    gate = plugin.busy_poll_gate
    assert isinstance(gate, SpareCPU) is gated
    if isinstance(gate, SpareCPU):
        assert gate.stat == tmp_path / "stat"
        # this test runs flat out between two samples microseconds apart: its own CPU would be a whole core
        gate._own_cpu = lambda: 0.0
        assert gate() is False  # closed until two samples
        gate._read_at = -1e9  # the period has passed
        (tmp_path / "stat").write_text(stat_text(1000 + 400, 1000))  # both cores busy since
        assert gate() is False
        gate._read_at = -1e9
        (tmp_path / "stat").write_text(stat_text(1400, 1000 + 400))  # both idle since
        assert gate() is True
