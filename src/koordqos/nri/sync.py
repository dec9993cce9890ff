"""The Synchronize exchange's slicing: chunks decoded, NodeState replaced, the reply encoded and the messages
released, each a slice (`SYNC_SLICE_SECONDS`) per loop step.

A Synchronize carries every pod and container of the node (thousands of messages, several MB in chunks of
up to the 4 MiB ttrpc limit); done in one go, each of these steps was tens of ms in one loop step. The
session (`nri/session.py`) runs the exchange with these pieces.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from koordqos.errors import ProtocolError
from koordqos.events.types import (
    Event,
    RuntimeContainer,
    RuntimeSandbox,
    RuntimeSynchronized,
    SourceSynced,
)
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import SYNC_SLICE_SECONDS, NRISynchronize
from koordqos.nri.limits import RuntimeObjectLimits
from koordqos.nri.payload import MalformedPayload, parse_payload
from koordqos.nri.runtime_objects import runtime_container, runtime_sandbox
from koordqos.nri.ttrpc import WIRE_LEN, WIRE_VARINT, BytesLike, bytes_field, next_field, read_varint

__all__ = [
    "BULK_DECODE_BYTES",
    "SyncChunk",
    "SyncExchange",
    "decode_chunk",
    "release",
    "replace_state",
    "sync_reply",
]

BULK_DECODE_BYTES = 128 << 10  # Synchronize chunks up to this size are decoded in one go (≈ 0.5 ms)


class SyncChunk:
    """One Synchronize chunk, decoded in slices: a chunk of a few MB (up to the 4 MiB ttrpc limit: NRI
    splits larger syncs) costs upb 10–20 ms in one go, so a large one is walked field by field and its
    pods and containers decoded one by one until a slice's time is up. Malformed input raises
    MalformedPayload, as `parse_payload` does."""

    __slots__ = ("_data", "_pos", "containers", "more", "pods")

    def __init__(self, payload: BytesLike) -> None:
        self._data = payload
        self._pos = 0
        self.pods: list[api.PodSandbox] = []
        self.containers: list[api.Container] = []
        self.more = False

    def decode(self, until: float) -> bool:
        """Decode until `until` (perf_counter) passes; True once the whole chunk is decoded."""
        data = self._data
        if self._pos == 0 and len(data) <= BULK_DECODE_BYTES:
            req = parse_payload(api.SynchronizeRequest, data, "Synchronize")
            self.pods, self.containers, self.more = list(req.pods), list(req.containers), req.more
            self._pos = len(data)
            return True
        pos, end = self._pos, len(data)
        clock = time.perf_counter
        try:
            while pos < end:
                number, wire, start, stop = next_field(data, pos)
                if wire == WIRE_LEN and number == 1:
                    self.pods.append(parse_payload(api.PodSandbox, data[start:stop], "Synchronize"))
                elif wire == WIRE_LEN and number == 2:
                    self.containers.append(parse_payload(api.Container, data[start:stop], "Synchronize"))
                elif wire == WIRE_VARINT and number == 3:
                    self.more = read_varint(data, start)[0] != 0
                # any other field: unknown to this schema, skipped (as protobuf keeps it aside)
                pos = stop
                if clock() > until:
                    break
        except ProtocolError as exc:
            raise MalformedPayload(
                f"Synchronize: payload does not parse as SynchronizeRequest: {exc}"
            ) from None
        self._pos = pos
        return pos >= end


async def decode_chunk(payload: BytesLike) -> SyncChunk:
    """`payload` decoded, a multi-MB chunk in slices, not in one loop step."""
    chunk = SyncChunk(payload)
    while not chunk.decode(time.perf_counter() + SYNC_SLICE_SECONDS):
        await asyncio.sleep(0)
    return chunk


class SyncExchange:
    """The chunks of one Synchronize exchange so far: the union of their pods and containers (capped: a
    runtime could send `more` chunks forever) and when its first chunk arrived."""

    __slots__ = ("containers", "pods", "started")

    def __init__(self) -> None:
        self.pods: list[api.PodSandbox] = []
        self.containers: list[api.Container] = []
        self.started: float | None = None

    def add(self, chunk: SyncChunk, received: float, limits: RuntimeObjectLimits) -> None:
        """Take in a chunk that arrived at `received` (monotonic)."""
        if self.started is None:
            self.started = received  # one request timeout covers the whole chunked exchange
        self.pods.extend(limits.cap("sandbox", self.pods, chunk.pods))
        self.containers.extend(limits.cap("container", self.containers, chunk.containers))

    def take(self) -> tuple[list[api.PodSandbox], list[api.Container], float | None]:
        """The whole exchange (its pods, containers and start), leaving this one empty for the next."""
        taken = self.pods, self.containers, self.started
        self.pods, self.containers, self.started = [], [], None
        return taken


async def replace_state(
    pods: list[api.PodSandbox], containers: list[api.Container], publish: Callable[[Event], None]
) -> None:
    """Make NodeState's runtime view exactly the synchronized one (stale entries from before go): the
    records are built in slices (≈ 10 µs each, thousands of them), then published as one event."""
    # from a fresh step: the one that got here ran the chunk's last decoding slice (two slices in one
    # step were the longest of a large Synchronize)
    await asyncio.sleep(0)
    uid_of = {p.id: p.uid for p in pods}
    sandboxes: list[RuntimeSandbox] = []
    records: list[RuntimeContainer] = []
    clock = time.perf_counter
    until = clock() + SYNC_SLICE_SECONDS
    for i, pod in enumerate(pods):
        sandboxes.append(runtime_sandbox(pod))
        if i % 16 == 15 and clock() > until:
            await asyncio.sleep(0)
            until = clock() + SYNC_SLICE_SECONDS
    for i, ctr in enumerate(containers):
        records.append(runtime_container(ctr, uid_of.get(ctr.pod_sandbox_id, "")))
        if i % 16 == 15 and clock() > until:
            await asyncio.sleep(0)
            until = clock() + SYNC_SLICE_SECONDS
    # NodeState takes in the thousands of records at once (≈ 2 ms for 2,500): a step of its own
    await asyncio.sleep(0)
    publish(RuntimeSynchronized(tuple(sandboxes), tuple(records)))
    # in the same step: no subscriber sees the runtime's pods without knowing that they are all of them
    # (local mode's pods come from here: the reconciler's dangling-pod-dir step waits for it)
    publish(SourceSynced("nri"))
    await asyncio.sleep(0)


async def sync_reply(event: NRISynchronize) -> tuple[bytes, int]:
    """`SynchronizeResponse{update = effective updates, more = false}` and the number of updates, encoded
    one update at a time (thousands of them cost tens of ms as one message) with a yield every slice."""
    await asyncio.sleep(0)  # from a fresh step: the one that got here ran the hooks' last slice
    parts: list[bytes] = []
    clock = time.perf_counter
    until = clock() + SYNC_SLICE_SECONDS
    for i, upd in enumerate(event.updates):
        if i % 16 == 15 and clock() > until:
            await asyncio.sleep(0)
            until = clock() + SYNC_SLICE_SECONDS
        if upd.container_id and upd.linux.resources.ByteSize() > 0:  # as `effective_updates()`
            parts.append(bytes_field(1, upd.SerializeToString()))
    return b"".join(parts), len(parts)  # `more` false: proto3 leaves it out


async def release(*lists: list[Any]) -> None:
    """Empty `lists` a few items per loop step: the messages of a 2,500-container Synchronize, freed at once
    when the handler returned, were ~6 ms of deallocation in one step."""
    clock = time.perf_counter
    for items in lists:
        await asyncio.sleep(0)  # each list from a fresh step: what ran before (the reply's encoding) and
        until = clock() + SYNC_SLICE_SECONDS  # what runs after (the reply's write) are steps of their own
        while items:
            del items[-64:]
            if clock() > until:
                await asyncio.sleep(0)
                until = clock() + SYNC_SLICE_SECONDS
    await asyncio.sleep(0)
