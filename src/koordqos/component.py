"""Component: a long-running part of the agent, and FunctionComponent, which adapts an async function.

The lowest layer (imports nothing of koordqos): every package's builders return Components, `agent.py`
supervises them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol


class Component(Protocol):
    """A long-running part of the agent. `run` returns only when cancelled (or on a crash)."""

    @property
    def name(self) -> str: ...

    @property
    def essential(self) -> bool: ...

    async def run(self) -> None: ...


@dataclass
class FunctionComponent:
    """Adapts an async function to Component."""

    name: str
    func: Callable[[], Awaitable[None]]
    essential: bool = False

    async def run(self) -> None:
        """Run the wrapped function."""
        await self.func()


ShutdownStep = Callable[[], Awaitable[None]]
