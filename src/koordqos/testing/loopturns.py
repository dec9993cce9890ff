"""Counting the event loop's turns around a call: whether a long piece of work gives the loop a turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class LoopTurns:
    """How many times another task ran while the `counting()` block awaited."""

    def __init__(self) -> None:
        self.count = 0


@asynccontextmanager
async def counting() -> AsyncIterator[LoopTurns]:
    """`async with counting() as turns: await work()` — then `turns.count` is the number of times a task
    that yields after every step ran in between: 0 when the work never gave the loop a turn."""
    turns = LoopTurns()
    running = True

    async def spin() -> None:
        while running:
            turns.count += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(spin())
    await asyncio.sleep(0)  # let it start; its first turn is not the work's
    turns.count = 0
    try:
        yield turns
    finally:
        running = False
        task.cancel()
