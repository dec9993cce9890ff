"""Kubernetes watch stream decoding, sans-I/O: feed bytes in, watch events out.

A watch response is a stream of JSON objects separated by newlines: `{"type": "ADDED", "object": {...}}`.
Types: ADDED, MODIFIED, DELETED, BOOKMARK (only `metadata.resourceVersion` is meaningful) and ERROR (the
object is a `Status`, e.g. code 410 when the requested resourceVersion is too old).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from koordqos.errors import ProtocolError

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})
MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One decoded watch event; `object` is the raw dict."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        """metadata.resourceVersion of the object ("" when absent)."""
        meta = self.object.get("metadata")
        return str(meta.get("resourceVersion", "")) if isinstance(meta, dict) else ""

    @property
    def status_code(self) -> int:
        """For ERROR events: the Status code (0 when absent)."""
        code = self.object.get("code", 0)
        return code if isinstance(code, int) else 0


class WatchDecoder:
    """Splits a byte stream into newline-delimited JSON watch events."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max_line = max_line

    def feed(self, data: bytes) -> list[WatchEvent]:
        """Add bytes; return every complete event. ProtocolError on garbage or an oversized line."""
        self._buf += data
        events: list[WatchEvent] = []
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end < 0:
                break
            line = bytes(self._buf[start:end]).strip()
            start = end + 1
            if line:
                events.append(decode_event(line))
        if start:
            del self._buf[:start]
        if len(self._buf) > self._max_line:
            self._buf.clear()
            raise ProtocolError(f"watch event larger than {self._max_line} bytes")
        return events

    def close(self) -> list[WatchEvent]:
        """End of stream: decode a final event without a trailing newline, if any."""
        rest = bytes(self._buf).strip()
        self._buf.clear()
        return [decode_event(rest)] if rest else []

    @property
    def pending(self) -> int:
        """Bytes buffered without a newline yet."""
        return len(self._buf)


def decode_event(line: bytes) -> WatchEvent:
    """One JSON line → WatchEvent; ProtocolError when it is not a watch event."""
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"watch stream: invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("watch stream: event is not an object")
    etype = doc.get("type")
    obj = doc.get("object")
    if etype not in EVENT_TYPES:
        raise ProtocolError(f"watch stream: unknown event type {etype!r}")
    if not isinstance(obj, dict):
        raise ProtocolError(f"watch stream: {etype} event without an object")
    return WatchEvent(str(etype), obj)
