"""Supervisor: runs the agent's components, restarting a crashed one with capped exponential backoff."""

from __future__ import annotations

import asyncio
import random
import time

import structlog

from koordqos import observability as obs
from koordqos.component import Component
from koordqos.errors import StartupError

log = structlog.get_logger("koordqos.agent")


class Supervisor:
    """Runs components; restarts a crashed one with capped exponential backoff; counts crashes."""

    def __init__(self, base_delay: float = 0.5, max_delay: float = 30.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.crashes: dict[str, int] = {}

    async def supervise(self, comp: Component) -> None:
        """Run `comp` forever: a crash is logged, counted and followed by a restart after a backoff."""
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await comp.run()
                log.info("component returned", component=comp.name)
                return
            except asyncio.CancelledError:
                raise
            except StartupError:
                raise  # cannot start at all: the agent exits (supervision is for failures after start)
            except Exception as exc:
                self.crashes[comp.name] = self.crashes.get(comp.name, 0) + 1
                obs.COMPONENT_RESTARTS.labels(comp.name).inc()
                # a component that ran for a while before crashing starts its backoff afresh
                failures = 1 if time.monotonic() - started > 60 else failures + 1
                delay = min(self.max_delay, self.base_delay * 2 ** (failures - 1))
                delay *= 1 + random.uniform(-0.1, 0.1)
                log.error(
                    "component crashed; restarting",
                    component=comp.name,
                    essential=comp.essential,
                    attempt=failures,
                    retry_in_s=round(delay, 2),
                    error=f"{type(exc).__name__}: {exc}",
                    exc_info=exc,
                )
                await asyncio.sleep(delay)
