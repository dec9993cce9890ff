"""NRI connection multiplexer (containerd/nri pkg/net/multiplex), sans-I/O.

The socket carries frames `conn id (u32 BE) | length N (u32 BE) | N payload bytes`. Conn 1 carries the
plugin service (the runtime calls us), conn 2 the runtime service (we call it); each is an independent
byte stream and frame boundaries mean nothing to ttrpc. `MuxDecoder` turns socket bytes into
`(conn_id, payload)` frames, dropping (and counting) frames for ids it does not serve. `frames_for`
implements the sending rule a Go runtime can read: a ttrpc message of at most 4096 bytes as one frame,
otherwise its first 4096 bytes and then the rest, never two messages in one frame.

With `stream=True` a large frame (STREAM_FRAME_BYTES or more: the rest of a multi-MB Synchronize) is not
held until complete: its payload is passed on piece by piece as it arrives, so it is copied once, a piece per
loop step, into the ttrpc decoder (holding it here and copying it out whole was a ~1.5 ms step of its own).
A runtime-side check of whole frames (the mock runtime's) uses the default, whole frames.
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
STREAM_FRAME_BYTES = 1 << 16
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

    __slots__ = ("_accept", "_buf", "_left", "_left_conn", "_stream", "dropped")

    def __init__(
        self,
        accept: frozenset[int] = frozenset({PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN}),
        stream: bool = False,
    ) -> None:
        self._accept = accept
        self._buf = bytearray()
        self._stream = stream
        self._left = 0  # payload bytes still to come of the frame being streamed
        self._left_conn: int | None = None  # its conn id (None: a conn nobody serves, dropped)
        self.dropped = 0  # frames for conn ids nobody serves

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame (a streamed frame's pieces are passed on)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add socket bytes; return the completed frames as (conn_id, payload) (with `stream`, a large
        frame as several pieces of its payload, in order)."""
        out: list[tuple[int, bytes]] = []
        left = self._left
        if left:
            n = len(data)
            if n <= left:
                self._left = left - n
                if self._left_conn is not None:
                    out.append((self._left_conn, data))
                return out
            if self._left_conn is not None:
                out.append((self._left_conn, data[:left]))
            self._left = 0
            data = data[left:]
        buf = self._buf
        buf += data
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
                if self._stream and length >= STREAM_FRAME_BYTES:
                    # what is here now goes on, the rest as it arrives
                    if conn_id in self._accept:
                        self._left_conn = conn_id
                        if end > pos + FRAME_HEADER_SIZE:
                            out.append((conn_id, take_bytes(buf, pos + FRAME_HEADER_SIZE, end)))
                    else:
                        self._left_conn = None
                        self.dropped += 1
                    self._left = stop - end
                    pos = end
                break
            if conn_id in self._accept:
                out.append((conn_id, take_bytes(buf, pos + FRAME_HEADER_SIZE, stop)))
            else:
                self.dropped += 1
            pos = stop
        if pos:
            del buf[:pos]
        return out
