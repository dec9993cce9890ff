"""PluginLink: one accepted plugin connection and what the mock runtime learned from it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.connection import NRIConnection


@dataclass(eq=False)
class PluginLink:
    """One accepted plugin connection and everything the runtime learned from it."""

    conn: NRIConnection
    accepted_at: float
    name: str = ""
    index: str = ""
    nri_version: str = ""
    events: int = 0
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    configured: asyncio.Event = field(default_factory=asyncio.Event)
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: asyncio.Event = field(default_factory=asyncio.Event)
    drop_reason: str = ""
    register_rejected: str = ""
    fallback: set[str] = field(default_factory=set)  # events moved to StateChange after UNIMPLEMENTED
    sync_chunks: int = 0
    sync_replies: list[api.SynchronizeResponse] = field(default_factory=list)
    sync_seconds: float = 0.0
    update_requests: list[api.UpdateContainersRequest] = field(default_factory=list)

    @property
    def sync_updates(self) -> list[api.ContainerUpdate]:
        """The updates of the final Synchronize reply."""
        return list(self.sync_replies[-1].update) if self.sync_replies else []
