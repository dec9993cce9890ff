"""SyncGate / AfterSync (syncgate.py): what acts on the node starts once its sources synced once."""

from __future__ import annotations

import asyncio
from typing import Any

from koordqos.bus import EventBus
from koordqos.component import FunctionComponent
from koordqos.events.types import SourceSynced
from koordqos.state import NodeState
from koordqos.syncgate import STATUS_KEY, AfterSync, SyncGate
from koordqos.testing.poll import wait_until

SOURCES = ("pods", "node", "nodeslo")


async def test_the_component_starts_once_every_source_synced_and_the_gate_stays_open() -> None:
    bus = EventBus()
    status: dict[str, Any] = {}
    gate = SyncGate(bus, SOURCES, status)
    started = asyncio.Event()

    async def acts() -> None:
        started.set()
        await asyncio.Event().wait()

    comp = AfterSync(FunctionComponent("acts", acts, essential=True), gate)
    assert (comp.name, comp.essential) == ("acts", True)
    run_bus = asyncio.create_task(bus.run())
    run = asyncio.create_task(comp.run())
    try:
        assert status[STATUS_KEY] == "node, nodeslo, pods"
        await bus.publish(SourceSynced(source="pods"))
        await bus.publish(SourceSynced(source="node"))
        await bus.drained()
        assert not started.is_set()
        assert status[STATUS_KEY] == "nodeslo"
        await bus.publish(SourceSynced(source="nodeslo"))
        await wait_until(started.is_set, timeout=5, message="the component started")
        assert gate.is_open
        assert STATUS_KEY not in status
    finally:
        run.cancel()
        run_bus.cancel()
        await asyncio.gather(run, run_bus, return_exceptions=True)


async def test_an_already_synced_state_opens_the_gate_at_once_without_a_subscription() -> None:
    bus = EventBus(NodeState(synced=frozenset(SOURCES)))
    gate = SyncGate(bus, SOURCES)
    assert gate.is_open
    assert not bus.subscriptions
    await asyncio.wait_for(gate.wait("x"), 1)
