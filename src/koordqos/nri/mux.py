"""NRI connection multiplexer (containerd/nri pkg/net/multiplex), sans-I/O.

The socket carries frames `conn id (u32 BE) | length N (u32 BE) | N payload bytes`. Conn 1 carries the
plugin service (the runtime calls us), conn 2 the runtime service (we call it); each is an independent
byte stream and frame boundaries mean nothing to ttrpc. `MuxDecoder` turns socket bytes into
`(conn_id, payload)` frames, dropping (and counting) frames for ids it does not serve. `frames_for`
implements the sending rule a Go runtime can read: a ttrpc message of at most 4096 bytes as one frame,
otherwise its first 4096 bytes and then the rest, never two messages in one frame.
"""

from __future__ import annotations

import struct

from koordqos.errors import ProtocolError
from koordqos.nri.ttrpc import HEADER_SIZE, MAX_DATA_SIZE, take_bytes

PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
FRAME_HEADER_SIZE = 8
GO_READ_BUFFER = 4096  # the Go ttrpc reader's bufio size: the largest frame it can take between messages
# The Go writer never puts more than one maximal ttrpc message into a frame; anything larger is garbage
# (and would otherwise make us buffer without bound).
MAX_FRAME_PAYLOAD = HEADER_SIZE + MAX_DATA_SIZE
_FRAME = struct.Struct(">II")


def encode_frame(conn_id: int, payload: bytes) -> bytes:
    """One mux frame."""
    return _FRAME.pack(conn_id, len(payload)) + payload


def frames_for(conn_id: int, message: bytes) -> list[bytes]:
    """The frames that carry one ttrpc message under the sending rule (one, or 4096 bytes + the rest)."""
    if len(message) <= GO_READ_BUFFER:
        return [encode_frame(conn_id, message)]
    return [encode_frame(conn_id, message[:GO_READ_BUFFER]), encode_frame(conn_id, message[GO_READ_BUFFER:])]


class MuxDecoder:
    """Splits the socket byte stream into frames for the conn ids in `accept`."""

    __slots__ = ("_accept", "_buf", "dropped")

    def __init__(
        self, accept: frozenset[int] = frozenset({PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN})
    ) -> None:
        self._accept = accept
        self._buf = bytearray()
        self.dropped = 0  # frames for conn ids nobody serves

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add socket bytes; return the completed frames as (conn_id, payload)."""
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= FRAME_HEADER_SIZE:
            conn_id, length = _FRAME.unpack_from(buf, pos)
            if length > MAX_FRAME_PAYLOAD:
                raise ProtocolError(
                    f"mux frame of {length} bytes on conn {conn_id} exceeds {MAX_FRAME_PAYLOAD}"
                )
            stop = pos + FRAME_HEADER_SIZE + length
            if stop > end:
                break
            if conn_id in self._accept:
                out.append((conn_id, take_bytes(buf, pos + FRAME_HEADER_SIZE, stop)))
            else:
                self.dropped += 1
            pos = stop
        if pos:
            del buf[:pos]
        return out
