"""LoopLagMonitor: how late the event loop wakes a timer (`koordqos_loop_lag_seconds`)."""

from __future__ import annotations

import asyncio

from koordqos import observability as obs


class LoopLagMonitor:
    """Measures how late the loop wakes a 100 ms timer; exported as a histogram."""

    name = "loop-lag"
    essential = False

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.last_lag = 0.0

    async def run(self) -> None:
        """Probe forever."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            self.last_lag = max(0.0, loop.time() - start - self.interval)
            obs.LOOP_LAG.observe(self.last_lag)
