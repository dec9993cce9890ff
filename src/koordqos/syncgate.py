"""Acting only on a complete view: components that change the node start once its sources have synced.

koordlet starts its QoS manager and runtime hooks only after its states informer synced
(docs/behaviour-qos-manager.md, "Start after the sources synced"): a value derived from pods, the Node or a
NodeSLO not yet listed is a wrong value written (a BE pod's limits before the NodeSLO, the GroupIdentity
defaults before its rule). `SyncGate` opens once `NodeState.synced` holds every source, and stays open (a
later outage keeps the last view, as koordlet does); `AfterSync` runs a component once the gate is open. While
API servers are unreachable the reflectors back off, `/readyz` answers 503 and these components have not
started.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, MutableMapping
from typing import Any

import structlog

from koordqos.bus import EventBus, always
from koordqos.component import Component
from koordqos.events.types import SourceSynced
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.agent")

STATUS_KEY = "waiting_for_sync"  # the missing sources, in the agent's status (/readyz) while closed


class SyncGate:
    """Open once the bus's state has synced every one of `sources` (then for good)."""

    def __init__(
        self,
        bus: EventBus,
        sources: Collection[str],
        status: MutableMapping[str, Any] | None = None,
        name: str = "sync-gate",
    ) -> None:
        self.bus = bus
        self.sources = frozenset(sources)
        self.status: MutableMapping[str, Any] = {} if status is None else status
        self.waiting: list[str] = []  # the components waiting, for the log line
        self._open = asyncio.Event()
        self._started = time.monotonic()
        self._logged = False
        self._note(bus.state)
        if not self.is_open:
            bus.subscribe(name, self._on_synced, SourceSynced, immediate=always(self._on_synced))

    @property
    def is_open(self) -> bool:
        """Whether every source has synced once."""
        return self._open.is_set()

    def missing(self, state: NodeState) -> list[str]:
        """The sources `state` has not synced yet, sorted."""
        return sorted(self.sources - state.synced)

    def _on_synced(self, event: SourceSynced, state: NodeState) -> None:
        self._note(state)

    def _note(self, state: NodeState) -> None:
        if self.is_open:
            return
        missing = self.missing(state)
        if missing:
            self.status[STATUS_KEY] = ", ".join(missing)
            return
        self._open.set()
        self.status.pop(STATUS_KEY, None)
        if self._logged:
            log.info(
                "node sources synced; starting what acts on the node",
                sources=sorted(self.sources),
                components=self.waiting,
                waited_s=round(time.monotonic() - self._started, 3),
            )

    async def wait(self, component: str) -> None:
        """Return once the gate is open; the first wait on a closed gate logs what waits for what."""
        if self.is_open:
            return
        self.waiting.append(component)
        if not self._logged:
            self._logged = True
            # once the callers are all waiting: the line names every one of them
            await asyncio.sleep(0)
            if not self.is_open:
                log.info(
                    "waiting for the node's sources before acting on the node",
                    missing=self.missing(self.bus.state),
                    components=self.waiting,
                )
        await self._open.wait()


class AfterSync:
    """`component`, started once `gate` is open (its name and essential flag are the component's)."""

    def __init__(self, component: Component, gate: SyncGate) -> None:
        self.component = component
        self.gate = gate
        self.name = component.name
        self.essential = component.essential

    async def run(self) -> None:
        """Wait for the gate, then run the component."""
        await self.gate.wait(self.name)
        await self.component.run()
