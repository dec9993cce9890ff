"""ttrpc (containerd/ttrpc v1.2) message framing and envelopes, sans-I/O.

A ttrpc message is a 10-byte big-endian header (data length, stream id, type, flags) followed by `length`
bytes of protobuf: a `Request` or `Response` envelope (koordqos.nri.api.ttrpc_pb2). `TtrpcDecoder` turns
a byte stream fed in arbitrary pieces into messages; the encoders build messages. Stream-id rules (odd,
strictly increasing, chosen by the client) are checked by `ServerStreams` and allocated by
`ClientStreams`. Every malformed input raises `ProtocolError` and nothing else.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from koordqos.errors import ProtocolError
from koordqos.nri.api import ttrpc_pb2

HEADER_SIZE = 10
MAX_DATA_SIZE = 4 << 20  # ttrpc's message length limit (4 MiB)
_HEADER = struct.Struct(">IIBB")
# A message at least this long leaves the decoder in the buffer it was received into (a view, no copy), and
# its Request envelope is split without copying the payload: a fresh copy of a multi-MB Synchronize costs
# ~1.5 ms of page faults, three of them were one 4–7 ms step (docs/performance-history.md,
# "Session 25: the large frame without copies").
HANDOVER_BYTES = 1 << 16

BytesLike = bytes | memoryview


class MessageType(enum.IntEnum):
    """ttrpc message types."""

    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Code(enum.IntEnum):
    """gRPC status codes used on ttrpc."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13


# `__init__` declared: native when compiled (see `hooks.resources.Resources`); not frozen, as a frozen class's
# `__init__` must go through `object.__setattr__`
@dataclass(slots=True, init=False)
class Message:
    """One ttrpc message: header fields and the raw (undecoded) data. Not changed once made."""

    stream_id: int
    type: int
    flags: int
    data: BytesLike  # a memoryview for a message of HANDOVER_BYTES or more

    def __init__(self, stream_id: int, type: int, flags: int, data: BytesLike) -> None:
        self.stream_id = stream_id
        self.type = type
        self.flags = flags
        self.data = data


def encode_message(stream_id: int, mtype: int, data: bytes, flags: int = 0) -> bytes:
    """Header + data as one bytes object; raises ProtocolError for data over 4 MiB."""
    if len(data) > MAX_DATA_SIZE:
        raise ProtocolError(f"ttrpc message of {len(data)} bytes exceeds the 4 MiB limit")
    return _HEADER.pack(len(data), stream_id, mtype, flags) + data


def take_bytes(buf: bytearray, start: int, stop: int) -> bytes:
    """`bytes(buf[start:stop])`, which copies twice, with one copy for a large piece (a multi-MB
    Synchronize)."""
    if stop - start < 65536:
        return bytes(buf[start:stop])
    with memoryview(buf) as view:
        return bytes(view[start:stop])


class TtrpcDecoder:
    """Parses ttrpc messages out of one logical connection's byte stream."""

    __slots__ = ("_buf", "_need")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = HEADER_SIZE  # bytes needed before the next parse step can succeed

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete message."""
        return len(self._buf)

    def remaining(self) -> int | None:
        """Bytes still missing from the message in progress (None when between messages or mid-header)."""
        if len(self._buf) < HEADER_SIZE:
            return None
        length: int = struct.unpack_from(">I", self._buf)[0]
        return HEADER_SIZE + length - len(self._buf)

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes; return the messages completed by them (possibly none)."""
        buf = self._buf
        buf += data
        if len(buf) < self._need:
            return []
        out: list[Message] = []
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_SIZE:
            length, stream_id, mtype, flags = _HEADER.unpack_from(buf, pos)
            if length > MAX_DATA_SIZE:
                raise ProtocolError(
                    f"ttrpc message of {length} bytes on stream {stream_id} exceeds the 4 MiB limit"
                )
            stop = pos + HEADER_SIZE + length
            if stop > end:
                self._need = stop - pos
                break
            if length >= HANDOVER_BYTES:
                # handed over, not copied: the buffer goes with the message, what follows it (usually
                # nothing) starts a new one
                view = memoryview(buf)[pos + HEADER_SIZE : stop]
                self._buf = buf = buf[stop:]
                out.append(Message(stream_id, mtype, flags, view))
                pos, end = 0, len(buf)
                continue
            out.append(Message(stream_id, mtype, flags, take_bytes(buf, pos + HEADER_SIZE, stop)))
            pos = stop
        else:
            self._need = HEADER_SIZE
        if pos:
            del buf[:pos]
        return out


# -- envelopes ------------------------------------------------------------------------------------


def encode_request(service: str, method: str, payload: bytes, timeout_nano: int = 0) -> bytes:
    """A serialized `Request` envelope."""
    return ttrpc_pb2.Request(
        service=service, method=method, payload=payload, timeout_nano=timeout_nano
    ).SerializeToString()


def as_buffer(data: BytesLike) -> Any:
    """`data` for protobuf's `ParseFromString`, which takes any buffer (its stubs say bytes): no copy.
    Typed Any, not `cast(bytes, ...)`: compiled by mypyc a cast is a checked conversion, and a view (a
    message of HANDOVER_BYTES or more) raised TypeError there."""
    return data


class RequestEnvelope(Protocol):
    """What a request handler reads of a `Request` envelope (a parsed `ttrpc_pb2.Request`, or a
    `LargeRequest` whose payload is a view)."""

    @property
    def service(self) -> str: ...

    @property
    def method(self) -> str: ...

    @property
    def payload(self) -> BytesLike: ...

    @property
    def timeout_nano(self) -> int: ...


class LargeRequest:
    """A `Request` envelope of HANDOVER_BYTES or more: its fields parsed, its payload a view of the
    received message (protobuf would copy it into a new bytes object)."""

    __slots__ = ("method", "payload", "service", "timeout_nano")

    def __init__(self, head: ttrpc_pb2.Request, payload: BytesLike) -> None:
        self.service = head.service
        self.method = head.method
        self.timeout_nano = head.timeout_nano
        self.payload = payload


def decode_request(data: BytesLike) -> ttrpc_pb2.Request | LargeRequest:
    """Parse a `Request` envelope (a handed-over one without copying its payload); ProtocolError when it
    does not parse."""
    if type(data) is memoryview:  # only a message of HANDOVER_BYTES or more is handed over as a view
        return _decode_large_request(data)
    req = ttrpc_pb2.Request()
    try:
        req.ParseFromString(data)  # bytes here: a view went to _decode_large_request
    except (DecodeError, ValueError) as exc:
        raise ProtocolError(f"malformed ttrpc Request envelope: {exc}") from None
    return req


def _decode_large_request(data: memoryview) -> LargeRequest:
    # every field but the payload (service, method, timeout, metadata: a few bytes) goes to protobuf, which
    # checks them as ever; the payload is cut out as a view (the last one wins, as protobuf's parser does)
    rest: list[memoryview] = []
    payload: memoryview | None = None
    pos, end = 0, len(data)
    while pos < end:
        number, wire, start, stop = next_field(data, pos)
        if number == 3 and wire == WIRE_LEN:
            payload = data[start:stop]
        else:
            rest.append(data[pos:stop])
        pos = stop
    head = ttrpc_pb2.Request()
    try:
        head.ParseFromString(b"".join(rest))
    except (DecodeError, ValueError) as exc:
        raise ProtocolError(f"malformed ttrpc Request envelope: {exc}") from None
    return LargeRequest(head, payload if payload is not None else b"")


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


WIRE_VARINT, WIRE_I64, WIRE_LEN, WIRE_I32 = 0, 1, 2, 5


def read_varint(data: BytesLike, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; ProtocolError when truncated or over 10 bytes."""
    result = 0
    shift = 0
    end = len(data)
    while pos < end:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            break
    raise ProtocolError("malformed protobuf varint")


def next_field(data: BytesLike, pos: int) -> tuple[int, int, int, int]:
    """(field number, wire type, start, end) of the protobuf field at `pos`: `data[start:end]` is the value
    (the bytes of a length-delimited one, the encoded varint or fixed-size value otherwise) and `end` is
    where the next field starts. ProtocolError for truncated data and groups (nothing we read has them)."""
    key, pos = read_varint(data, pos)
    number, wire = key >> 3, key & 7
    if number == 0:
        raise ProtocolError("protobuf field number 0")
    if wire == WIRE_LEN:
        length, start = read_varint(data, pos)
        end = start + length
    elif wire == WIRE_VARINT:
        start = pos
        _, end = read_varint(data, pos)
    elif wire in (WIRE_I64, WIRE_I32):
        start, end = pos, pos + (8 if wire == WIRE_I64 else 4)
    else:
        raise ProtocolError(f"protobuf wire type {wire} not supported")
    if end > len(data):
        raise ProtocolError("truncated protobuf field")
    return number, wire, start, end


def bytes_field(number: int, data: bytes) -> bytes:
    """One length-delimited protobuf field (`bytes`, `string` or a serialized sub-message), as protobuf
    serializes it: tag, length, data. Replies that are one such field are built with it, which is several
    times faster than filling a message object to serialize it."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_response(payload: bytes = b"", code: int = Code.OK, message: str = "") -> bytes:
    """A serialized `Response` envelope; an error carries no payload (the Go client decodes that first)."""
    if code == Code.OK:
        # an empty success is an empty envelope (the RegisterPlugin reply is a bare 10-byte header);
        # otherwise `Response{payload = 2}`, the only field set
        return bytes_field(2, payload) if payload else b""
    return ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message)).SerializeToString()


def decode_response(data: BytesLike) -> ttrpc_pb2.Response:
    """Parse a `Response` envelope; ProtocolError when it does not parse."""
    resp = ttrpc_pb2.Response()
    try:
        resp.ParseFromString(as_buffer(data))
    except (DecodeError, ValueError) as exc:
        raise ProtocolError(f"malformed ttrpc Response envelope: {exc}") from None
    return resp


# -- stream ids -----------------------------------------------------------------------------------


class ServerStreams:
    """The server's check of client stream ids: odd and strictly increasing (ttrpc v1.2 rules)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0

    def accept(self, stream_id: int) -> None:
        """Record a request's stream id; ProtocolError when it breaks the rules."""
        if stream_id % 2 == 0:
            raise ProtocolError(f"request on even stream id {stream_id} (client streams must be odd)")
        if stream_id <= self.last:
            raise ProtocolError(f"request stream id {stream_id} reused or decreasing (last {self.last})")
        self.last = stream_id


class ClientStreams:
    """The client's stream ids: 1, 3, 5, … on one logical connection."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 1

    def next(self) -> int:
        """Allocate the next stream id."""
        sid = self._next
        if sid > 0xFFFFFFFF:
            raise ProtocolError("ttrpc stream ids exhausted on this connection")
        self._next += 2
        return sid
