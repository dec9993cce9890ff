"""BusyPoll: after a reply, keep the event loop polling for a short window instead of going to sleep.

A runtime often sends the next request right after our reply (a pod's containers, pods started together,
the calls after a Synchronize). If the loop has gone to sleep in `epoll_wait` by then, the request waits
for the thread — on a VM, for the vCPU the host halted — to wake up: ≈ 50–100 µs on the development
machine, a third of a whole CreateContainer round trip. A compiled Go plugin does not pay it, because the
Go scheduler spins for a while before it parks. This does the same for the agent: for `window` seconds
after a reply a callback re-schedules itself, so the loop keeps polling its sockets with a zero timeout
(one cheap syscall per turn) and runs a request the moment it arrives. Other callbacks run in between as
usual; the loop never blocks longer than one turn. It works the same on the stdlib loop and on uvloop.

The price is CPU: at most `window` per reply, only when the loop had nothing else to do. `window = 0`
turns it off. Each window ends as "caught" (a request came within it) or "expired", counted in
`koordqos_nri_busy_poll_windows_total`, so a node shows whether its runtime's calls come close enough
together to be worth it (docs/performance.md, "Busy-polling after a reply").
"""

from __future__ import annotations

import asyncio
import time

from koordqos.nri import metrics as m

_clock = time.perf_counter  # uvloop's loop.time() is cached per turn and has ms resolution


class BusyPoll:
    """The polling window after each reply of one connection."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._until = 0.0
        self._polling = False
        self._caught = m.BUSY_POLL_WINDOWS.labels("caught")
        self._expired = m.BUSY_POLL_WINDOWS.labels("expired")

    def replied(self) -> None:
        """A reply went out: poll until `window` from now (a window already running is extended)."""
        if self.window <= 0:
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
