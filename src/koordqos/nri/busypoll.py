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
is spare CPU — the agent passes `spare_cpu`: the last metrics round saw at least one core's worth idle.
`window = 0` turns it off. Each window ends as "caught" (a request came within it) or "expired", and a
reply that opened none because the gate said no counts as "skipped", all in
`koordqos_nri_busy_poll_windows_total`, so a node shows whether its runtime's calls come close enough
together to be worth it (docs/performance.md, "Busy-polling after a reply").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from koordqos.metrics.types import MetricSnapshot
from koordqos.nri import metrics as m
from koordqos.state import NodeState

_clock = time.perf_counter  # uvloop's loop.time() is cached per turn and has ms resolution
SPARE_CORES = 1.0  # idle CPU (cores, last metrics round) a node needs for the agent to poll after replies


def spare_cpu(state: NodeState) -> bool:
    """Whether the node had a core's worth of CPU idle in the last metrics round (True before the first
    round, or without the node's usage: the window's cost is bounded either way)."""
    tick = state.last_tick
    sample = None if tick is None else tick.sample
    if not isinstance(sample, MetricSnapshot):
        return True
    node = sample.node
    if node.cpu_usage_cores is None or node.cpu_count <= 0:
        return True
    return node.cpu_count - node.cpu_usage_cores >= SPARE_CORES


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
