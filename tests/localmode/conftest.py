"""Fixtures for local-mode tests: a running bus, a short temp dir (unix socket paths), condition waits."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from koordqos.bus import EventBus


@pytest.fixture
async def bus() -> AsyncIterator[EventBus]:
    b = EventBus()
    task = asyncio.create_task(b.run())
    yield b
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temp dir with a short path (unix socket paths are limited to ~108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="kqlocal-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
