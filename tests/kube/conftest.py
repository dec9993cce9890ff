"""Fixtures for the Kubernetes integration tests: a fake API server on 127.0.0.1 and a running bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from koordqos.bus import EventBus
from koordqos.events.types import Event
from koordqos.kube import KubeConnection
from koordqos.kube.client import KubeClient
from koordqos.kube.reflector import ReflectorSettings
from koordqos.model.problems import forget_problems
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer

NODE = "node-a"


@pytest.fixture
async def fake() -> AsyncIterator[FakeAPIServer]:
    server = FakeAPIServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def conn(fake: FakeAPIServer, tmp_path: Path) -> AsyncIterator[KubeConnection]:
    """A connection built from a generated kubeconfig file, as the agent does."""
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    c = KubeConnection(str(kubeconfig), in_cluster=False)
    yield c
    await c.close()


@pytest.fixture
async def client(conn: KubeConnection) -> KubeClient:
    return await conn.get()


class Recorder:
    """Subscribes to every event and keeps them in order."""

    def __init__(self, bus: EventBus) -> None:
        self.events: list[Event] = []
        bus.subscribe("test-recorder", self._on, Event)

    def _on(self, event: Event, state: Any) -> None:
        self.events.append(event)

    def of(self, etype: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, etype)]


@pytest.fixture
async def bus() -> AsyncIterator[EventBus]:
    forget_problems()
    b = EventBus()
    task = asyncio.create_task(b.run())
    yield b
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def recorder(bus: EventBus) -> Recorder:
    return Recorder(bus)


@pytest.fixture
def fast() -> ReflectorSettings:
    """Short timeouts so silent connections and backoff resolve quickly in tests."""
    return ReflectorSettings(
        resync_seconds=3600,
        watch_timeout_seconds=30,
        read_timeout_seconds=5,
        page_size=7,
        backoff_base=0.05,
        backoff_cap=0.2,
    )


async def watches_open(fake: FakeAPIServer, *plurals: str) -> None:
    """Wait until the fake server has an open watch for each resource (a list alone is not enough)."""
    await wait_until(
        lambda: all(any(w.plural == p for w in fake.watchers) for p in plurals),
        message=f"watches open on {plurals}",
    )
