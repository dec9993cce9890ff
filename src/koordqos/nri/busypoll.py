"""BusyPoll: after a reply, keep the event loop polling for a short window instead of going to sleep.

A runtime often sends the next request right after our reply (a pod's containers, pods started together,
the calls after a Synchronize). If the loop has gone to sleep in `epoll_wait` by then, the request waits
for the thread — on a VM, for the vCPU the host halted — to wake up: ≈ 50–100 µs on the development
machine, a third of a whole CreateContainer round trip. A compiled Go plugin does not pay it, because the
Go scheduler spins for a while before it parks. This does the same for the agent: for `window` seconds
after a reply a callback re-schedules itself, so the loop keeps polling its sockets with a zero timeout
(one cheap syscall per turn) and runs a request the moment it arrives. Other callbacks run in between as
usual; the loop never blocks longer than one turn. It works the same on the stdlib loop and on uvloop.

The price is CPU: at most `window` per reply, only when the loop had nothing else to do. That CPU is
free only when a core is idle: on a busy node the polling thread holds a core that the runtime, or a
pod, is waiting for, and every call gets slower (measured: 1.1–1.5× the Go plugin's p50 without polling,
1.6–2.0× with it, two busy processes beside on 2 cores). So a window opens only while `gate()` says there
is spare CPU. The agent passes `SpareCPU`: at least one core's worth that nobody else used (idle, or used by
the agent itself) over the last ≥ 0.1 s, from the proc root's `stat`, sampled by the gate itself while
replies go out. (The metrics round was too slow a source: it knows the node's usage only from its second
round, so for the first 1–2 s after a start — the whole of a short benchmark run — the agent polled on a
busy node, measured 1.3–1.7× the Go plugin's p50 there against 0.8–1.1× gated.) `window = 0` turns it
off. Each window ends as "caught" (a request came within it) or "expired", and a reply that opened none
because the gate said no counts as "skipped", all in
`koordqos_nri_busy_poll_windows_total`, so a node shows whether its runtime's calls come close enough
together to be worth it (docs/performance-history.md, "Busy-polling after a reply (session 26)").
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from koordqos.metrics.procfs import parse_proc_stat, read_text
from koordqos.metrics.types import MetricSnapshot
from koordqos.nri import telemetry as m
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.nri")

_clock = time.perf_counter  # uvloop's loop.time() is cached per turn and has ms resolution
SPARE_CORES = 1.0  # CPU nobody else used (cores) a node needs for the agent to poll after replies


def spare_cpu(state: NodeState) -> bool:
    """Whether the node had a core's worth of CPU idle in the last metrics round (True before the first
    round, or without the node's usage: the window's cost is bounded either way). `SpareCPU`'s fallback,
    and the gate of a plugin built without one."""
    tick = state.last_tick
    sample = None if tick is None else tick.sample
    if not isinstance(sample, MetricSnapshot):
        return True
    node = sample.node
    if node.cpu_usage_cores is None or node.cpu_count <= 0:
        return True
    return node.cpu_count - node.cpu_usage_cores >= SPARE_CORES


class SpareCPU:
    """The busy-poll gate: whether at least `SPARE_CORES` of the node's CPU went unused by everybody but
    this process over the last `period` seconds or more.

    Sampled lazily, when asked (after a reply) and at most once a `period`: the proc root's `stat` (the
    node's busy and total ticks, its CPU count) and this process's CPU time. spare = cpus × idle share +
    this process's cores: the agent's own CPU — its calls, its polling — is what a window would take
    anyway, so it must not close the gate by itself. Closed until two samples a `period` apart (the first
    is taken at the first call — `BusyPoll` makes it as the connection opens —, so that the agent's own
    start-up is not in the window): polling takes CPU that may belong to someone else until shown
    otherwise. A `stat` that did not change since the last sample (a coarse tick, a synthetic root) keeps
    the verdict and the older sample as the base; one whose counters went backwards starts a new base.
    Unreadable or malformed, the gate says what `fallback` says (the metrics round's view; open without
    one), logged once per stretch of failures and counted in `koordqos_nri_busy_poll_gate_errors_total`."""

    def __init__(
        self,
        stat: Path,
        fallback: Callable[[], bool] | None = None,
        *,
        period: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        own_cpu: Callable[[], float] = time.process_time,
        read: Callable[[Path], str | None] = read_text,
    ) -> None:
        self.stat = stat
        self.fallback = fallback
        self.period = period
        self._clock = clock
        self._own_cpu = own_cpu
        self._read = read
        self._verdict = False
        self._read_at: float | None = None
        # the base sample: the node's busy and total ticks, this process's CPU seconds, when
        self._base: tuple[int, int, float, float] | None = None
        self._failing = False

    def __call__(self) -> bool:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self.period:
            self._read_at = now
            self._sample(now)
        if self._failing:
            return True if self.fallback is None else self.fallback()
        return self._verdict

    def _sample(self, now: float) -> None:
        text = self._read(self.stat)
        ticks = None if text is None else parse_proc_stat(text)
        if ticks is None:
            if not self._failing:
                self._failing = True
                m.BUSY_POLL_GATE_ERRORS.inc()
                log.warning(
                    "busy-poll gate cannot read the node's CPU; using the metrics round's view",
                    path=str(self.stat),
                    error="unreadable" if text is None else "no well-formed cpu line",
                )
            return
        self._failing = False
        own = self._own_cpu()
        base = self._base
        if base is not None:
            busy0, total0, own0, at0 = base
            total = ticks.total - total0
            if total == 0:
                return  # nothing new in the file: keep the verdict, and the base for a longer window
            if total > 0:
                cpus = ticks.online_cpus or os.cpu_count() or 1
                idle_share = max(0.0, 1.0 - (ticks.busy - busy0) / total)
                own_cores = max(0.0, own - own0) / max(now - at0, 1e-9)
                self._verdict = cpus * idle_share + own_cores >= SPARE_CORES
            # counters that went backwards (another file at that path): a new base, the verdict kept
        self._base = (ticks.busy, ticks.total, own, now)


class BusyPoll:
    """The polling window after each reply of one connection."""

    def __init__(self, window: float, gate: Callable[[], bool] | None = None) -> None:
        self.window = window
        self.gate = gate
        self._until = 0.0
        self._polling = False
        self._caught = m.BUSY_POLL_WINDOWS.labels("caught")
        self._expired = m.BUSY_POLL_WINDOWS.labels("expired")
        self._skipped = m.BUSY_POLL_WINDOWS.labels("skipped")
        if window > 0 and gate is not None:
            gate()  # a sampling gate (SpareCPU) takes its first sample as the connection opens

    def replied(self) -> None:
        """A reply went out: poll until `window` from now (a window already running is extended), when the
        gate allows."""
        if self.window <= 0:
            return
        if self.gate is not None and not self.gate():
            self._skipped.inc()
            return
        self._until = _clock() + self.window
        if not self._polling:
            self._polling = True
            asyncio.get_running_loop().call_soon(self._turn)

    @property
    def polling(self) -> bool:
        """Whether a window keeps the loop turning now."""
        return self._polling

    def stop(self) -> None:
        """The connection is gone: end the window, start no other."""
        self.window = 0.0
        self._until = 0.0

    def received(self) -> None:
        """A request arrived: the running window (if any) caught it and ends here."""
        if self._polling and _clock() < self._until:
            self._until = 0.0
            self._caught.inc()

    def _turn(self) -> None:
        if self._until == 0.0:  # caught or stopped: the next reply starts a new window
            self._polling = False
        elif _clock() < self._until:
            asyncio.get_running_loop().call_soon(self._turn)
        else:
            self._polling = False
            self._expired.inc()
