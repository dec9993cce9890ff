"""Decoding a request's payload: a message that does not parse is that request's error, not the connection's.

A malformed payload in an intact frame is answered with an error status (INVALID_ARGUMENT) and the
connection is kept; only a broken byte stream drops it (`ProtocolError` from the codecs).
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from koordqos.errors import ProtocolError
from koordqos.nri.ttrpc import BytesLike

__all__ = ["MalformedPayload", "parse_payload"]

P = TypeVar("P", bound=ProtoMessage)


class MalformedPayload(ProtocolError):
    """A message in an intact frame that does not parse: that request is answered with an error status, the
    connection is kept (only a broken byte stream drops it)."""


def parse_payload(cls: type[P], payload: BytesLike, method: str) -> P:
    """Decode a message of `cls`; MalformedPayload when it does not parse (whatever the parser raises)."""
    msg = cls()
    try:
        msg.ParseFromString(payload)  # type: ignore[arg-type]  # as ttrpc.as_buffer, without its call
    except (DecodeError, ValueError) as exc:
        raise MalformedPayload(f"{method}: payload does not parse as {cls.__name__}: {exc}") from None
    except Exception as exc:  # e.g. RecursionError from nesting: still just this message
        raise MalformedPayload(
            f"{method}: payload does not parse as {cls.__name__}: {type(exc).__name__}"
        ) from None
    return msg
