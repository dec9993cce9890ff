"""Large NRI messages (a multi-MB Synchronize) cross the codecs without whole copies: the mux streams a large
frame's payload to the ttrpc decoder as it arrives, the decoder hands a large message over in its buffer,
and the Request envelope is split without copying its payload. Each gives what the copying path gives."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.errors import ProtocolError
from koordqos.nri import mux as mux_module
from koordqos.nri import ttrpc as ttrpc_module
from koordqos.nri.answer import Answer
from koordqos.nri.api import ttrpc_pb2
from koordqos.nri.connection import NRIConnection
from koordqos.nri.mux import MuxDecoder, encode_frame, frames_for
from koordqos.nri.ttrpc import (
    HANDOVER_BYTES,
    LargeRequest,
    MessageType,
    RequestEnvelope,
    TtrpcDecoder,
    decode_request,
    decode_response,
    encode_message,
    encode_request,
    encode_response,
)
from koordqos.testing.pieces import split_at

frames = st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.binary(max_size=300)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(sent=frames, cuts=st.lists(st.integers(0, 3000), max_size=12))
def test_a_streamed_frame_gives_each_conn_its_bytes_in_order_whatever_the_split(
    sent: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    wire = b"".join(encode_frame(conn, payload) for conn, payload in sent)
    with mock.patch.object(mux_module, "STREAM_FRAME_BYTES", 16):  # frames of 16 bytes and more stream
        streaming = MuxDecoder(frozenset({1, 2}), stream=True)
        whole = MuxDecoder(frozenset({1, 2}))
        got_streamed = [f for piece in split_at(wire, cuts) for f in streaming.feed(piece)]
        got_whole = [f for piece in split_at(wire, cuts) for f in whole.feed(piece)]
    for conn in (1, 2):
        expected = b"".join(p for c, p in sent if c == conn)
        assert b"".join(p for c, p in got_streamed if c == conn) == expected
    assert got_whole == [(c, p) for c, p in sent if c in (1, 2)]  # the default: whole frames, as before
    assert {c for c, _ in got_streamed} <= {1, 2}
    dropped = sum(1 for c, _ in sent if c == 3)
    assert streaming.dropped == whole.dropped == dropped  # a dropped streamed frame counts once
    assert streaming.buffered == whole.buffered == 0


def test_a_large_frame_is_passed_on_as_it_arrives_not_held() -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB
    wire = encode_frame(1, payload)
    dec = MuxDecoder(stream=True)
    first = dec.feed(wire[:100_000])
    assert first == [(1, wire[8:100_000])]
    assert dec.buffered == 0  # nothing of it held
    rest = dec.feed(wire[100_000:] + encode_frame(2, b"next"))
    assert rest == [(1, wire[100_000:]), (2, b"next")]
    held = MuxDecoder()  # whole frames: held until complete
    assert held.feed(wire[:100_000]) == []
    assert held.buffered == 100_000


def test_a_large_message_is_handed_over_in_the_decoders_buffer() -> None:
    big = b"\x07" * (HANDOVER_BYTES + 10)
    after = encode_message(3, MessageType.REQUEST, b"small")
    stream = encode_message(1, MessageType.REQUEST, big) + after
    dec = TtrpcDecoder()
    out = dec.feed(stream[:1000]) + dec.feed(stream[1000 : len(stream) - 4])
    assert len(out) == 1
    assert isinstance(out[0].data, memoryview)  # a view of the received bytes, not a copy
    assert out[0].data == big
    assert out[0].stream_id == 1
    assert dec.buffered == len(after) - 4  # only what follows it is kept
    (tail,) = dec.feed(stream[-4:])
    assert (tail.stream_id, tail.data) == (3, b"small")
    assert isinstance(tail.data, bytes)


@settings(max_examples=150, deadline=None)
@given(
    msgs=st.lists(
        st.tuples(st.integers(0, 100).map(lambda i: 2 * i + 1), st.binary(max_size=80)), max_size=6
    ),
    cuts=st.lists(st.integers(0, 600), max_size=10),
)
def test_handed_over_messages_equal_copied_ones_whatever_the_split(
    msgs: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(encode_message(sid, MessageType.REQUEST, data) for sid, data in msgs)
    with mock.patch.object(ttrpc_module, "HANDOVER_BYTES", 8):
        dec = TtrpcDecoder()
        out = [m for piece in split_at(stream, cuts) for m in dec.feed(piece)]
    assert [(m.stream_id, bytes(m.data)) for m in out] == msgs
    assert all(isinstance(m.data, memoryview) == (len(m.data) >= 8) for m in out)
    assert dec.buffered == 0


envelopes = st.builds(
    ttrpc_pb2.Request,
    service=st.text(max_size=20),
    method=st.text(max_size=20),
    payload=st.binary(max_size=200),
    timeout_nano=st.integers(0, 2**63 - 1),
    metadata=st.lists(
        st.builds(ttrpc_pb2.KeyValue, key=st.text(max_size=8), value=st.text(max_size=8)), max_size=3
    ),
)


@settings(max_examples=200, deadline=None)
@given(req=envelopes, payload_first=st.booleans(), twice=st.booleans())
def test_a_large_request_envelope_decodes_as_protobuf_does(
    req: ttrpc_pb2.Request, payload_first: bool, twice: bool
) -> None:
    wire = req.SerializeToString()
    payload_field = ttrpc_pb2.Request(payload=req.payload).SerializeToString()
    if payload_first:  # fields in any order (Go writes them in field order)
        wire = (
            payload_field
            + ttrpc_pb2.Request(
                service=req.service, method=req.method, timeout_nano=req.timeout_nano, metadata=req.metadata
            ).SerializeToString()
        )
    if twice:  # a repeated scalar field: the last one wins
        wire = ttrpc_pb2.Request(payload=b"first").SerializeToString() + wire
    expected = ttrpc_pb2.Request.FromString(wire)
    with mock.patch.object(ttrpc_module, "HANDOVER_BYTES", 0):
        got = decode_request(memoryview(wire))
    assert isinstance(got, LargeRequest)
    assert (got.service, got.method, got.timeout_nano) == (
        expected.service,
        expected.method,
        expected.timeout_nano,
    )
    assert bytes(got.payload) == expected.payload


@pytest.mark.parametrize(
    "wire",
    [
        encode_request("svc", "M", b"x" * 100)[:-5],  # truncated payload
        b"\x0a\x02\xff\xfe" + ttrpc_pb2.Request(payload=b"p").SerializeToString(),  # service not UTF-8
        b"\x0b" + ttrpc_pb2.Request(payload=b"p").SerializeToString(),  # a group (wire type 3)
    ],
)
def test_a_malformed_large_request_envelope_is_a_protocol_error(wire: bytes) -> None:
    with mock.patch.object(ttrpc_module, "HANDOVER_BYTES", 0), pytest.raises(ProtocolError):
        decode_request(memoryview(wire))
    with pytest.raises(ProtocolError):
        decode_request(wire)  # as the copying path says


async def test_a_multi_megabyte_request_reaches_the_handler_as_a_view_of_the_received_bytes() -> None:
    payload = bytes(range(256)) * 12_000  # ≈ 3 MB, a large Synchronize's size
    seen: list[tuple[str, RequestEnvelope]] = []

    def handler(req: RequestEnvelope, received: float) -> Answer:
        seen.append((type(req.payload).__name__, req))
        return Answer(encode_response(b"ok"))

    conn = NRIConnection(handler)
    written = _connect(conn)
    env = encode_request("nri.pkg.api.v1alpha1.Plugin", "Synchronize", payload, 2_000_000_000)
    _deliver(conn, b"".join(frames_for(1, encode_message(1, MessageType.REQUEST, env))))
    ((kind, req),) = seen
    assert kind == "memoryview"
    assert (req.service, req.method, req.timeout_nano) == (
        "nri.pkg.api.v1alpha1.Plugin",
        "Synchronize",
        2_000_000_000,
    )
    assert req.payload == payload
    assert len(written) == 1
    assert conn.error is None


def test_a_large_response_envelope_handed_over_as_a_view_decodes() -> None:
    # the view is what the decoder hands over for a message of HANDOVER_BYTES or more; the compiled build's
    # `as_buffer` once checked it as bytes and raised TypeError (the mock runtime lost a large Synchronize
    # reply at 1,000 pods, and a plugin would lose a large runtime reply the same way)
    payload = bytes(range(256)) * 1024
    wire = encode_response(payload)
    assert len(wire) >= HANDOVER_BYTES
    assert decode_response(memoryview(wire)).payload == payload
    assert decode_response(memoryview(wire)) == decode_response(wire)


async def test_a_large_reply_to_a_call_reaches_the_caller() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: a large Synchronize reply, as the mock runtime receives it
    conn = NRIConnection(
        lambda req, received: Answer(encode_response()), role="runtime", serve_conn=2, client_conn=1
    )
    written = _connect(conn)
    call = asyncio.ensure_future(conn.call("nri.pkg.api.v1alpha1.Plugin", "Synchronize", b"", 5.0))
    await asyncio.sleep(0)  # the call's first step writes the request
    ((stream_id, _),) = [(m.stream_id, m) for m in _messages(written[0], conn_id=1)]
    _deliver(
        conn,
        b"".join(frames_for(1, encode_message(stream_id, MessageType.RESPONSE, encode_response(payload)))),
    )
    resp = await asyncio.wait_for(call, 5.0)
    assert resp.payload == payload
    assert conn.error is None


def _messages(wire: bytes, conn_id: int) -> list[ttrpc_module.Message]:
    dec = TtrpcDecoder()
    return [msg for conn, data in MuxDecoder().feed(wire) if conn == conn_id for msg in dec.feed(data)]


def _connect(conn: NRIConnection) -> list[bytes]:
    """Give `conn` a transport that records what it writes; the list of writes."""
    written: list[bytes] = []

    class Transport:
        def is_closing(self) -> bool:
            return False

        def writelines(self, data: list[bytes]) -> None:
            written.append(b"".join(data))

    conn.connection_made(Transport())  # type: ignore[arg-type]
    return written


def _deliver(conn: NRIConnection, wire: bytes) -> None:
    for i in range(0, len(wire), 262_144):  # as a socket delivers it
        conn.data_received(wire[i : i + 262_144])
