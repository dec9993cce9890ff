"""Fixtures for the NRI tests: a socket path, a mock runtime on it, and a running plugin."""

from __future__ import annotations

import asyncio
import inspect
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from koordqos.bus import EventBus
from koordqos.config import NRISettings
from koordqos.hooks.core import Call
from koordqos.nri.calls import NRICall
from koordqos.nri.plugin import NRIPlugin
from koordqos.observability import REGISTRY
from koordqos.state import NodeState
from koordqos.testing.mock_nri.runtime import MockRuntime


@pytest.fixture
def sock_path() -> Iterator[Path]:
    """A short socket path (unix socket paths are limited to 108 bytes, pytest's tmp_path can be longer)."""
    d = Path(tempfile.mkdtemp(prefix="kqnri-", dir="/tmp"))
    yield d / "nri" / "nri.sock"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def runtime(sock_path: Path) -> AsyncIterator[MockRuntime]:
    """A started mock runtime (request timeout 1 s)."""
    rt = MockRuntime(sock_path, request_timeout=1.0, registration_timeout=2.0)
    await rt.start()
    yield rt
    await rt.stop()


@pytest.fixture
def bus() -> EventBus:
    """A fresh bus (its state is what the plugin publishes)."""
    return EventBus()


def settings(sock: Path, **kw: Any) -> NRISettings:
    """Plugin settings for tests: fast reconnects."""
    base: dict[str, Any] = {
        "socket": sock,
        "backoff_seconds": 0.02,
        "backoff_cap_seconds": 0.2,
        "connect_timeout_seconds": 2.0,
    }
    base.update(kw)
    return NRISettings(**base)


class PluginRunner:
    """Starts NRIPlugin.run() as a task and stops it."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, plugin: NRIPlugin) -> NRIPlugin:
        self.tasks.append(asyncio.create_task(plugin.run()))
        return plugin

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def runner() -> AsyncIterator[PluginRunner]:
    """Runs plugins for the test and cancels them afterwards."""
    r = PluginRunner()
    yield r
    await r.stop()


class Handlers:
    """Stands in for the NRI adapter: functions `fn(event, state)` per NRI call type, run in the order
    added, inside the hook core's run_call (deadline, failure policy) as the real adapter is."""

    def __init__(self) -> None:
        self.by_type: dict[type[Any], list[Callable[[Any, NodeState], Any]]] = {}

    def on(self, cls: type[Any], fn: Callable[[Any, NodeState], Any]) -> None:
        self.by_type.setdefault(cls, []).append(fn)

    async def __call__(self, event: NRICall, state: NodeState, call: Call) -> None:
        for fn in self.by_type.get(type(event), ()):
            out = fn(event, state)
            if inspect.isawaitable(out):
                await out


@pytest.fixture
def handlers() -> Handlers:
    """What the plugin started by `start_plugin` answers its calls with (nothing, unless a test adds)."""
    return Handlers()


@pytest.fixture
def start_plugin(
    runner: PluginRunner, bus: EventBus, sock_path: Path, handlers: Handlers
) -> Callable[..., NRIPlugin]:
    """start_plugin(**plugin_kwargs, settings=...) -> a running NRIPlugin on the fixture socket."""

    def start(nri: NRISettings | None = None, **kw: Any) -> NRIPlugin:
        kw.setdefault("handler", handlers)
        return runner.start(NRIPlugin(bus, nri or settings(sock_path), **kw))

    return start


def metric(name: str, **labels: str) -> float:
    """Current value of a sample in the shared registry (0 when absent)."""
    value = REGISTRY.get_sample_value(name, labels)
    return value or 0.0
