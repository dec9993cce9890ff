"""ttrpc and mux codecs: the registration example's bytes (docs/behaviour-nri.md, "Frames the runtime can
read"), the sending rule, stream ids, and fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.errors import ProtocolError
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.mux import (
    GO_READ_BUFFER,
    MAX_FRAME_PAYLOAD,
    MuxDecoder,
    encode_frame,
    frames_for,
)
from koordqos.nri.ttrpc import (
    MAX_DATA_SIZE,
    ClientStreams,
    Code,
    Message,
    MessageType,
    ServerStreams,
    TtrpcDecoder,
    decode_request,
    decode_response,
    encode_message,
    encode_request,
    encode_response,
)
from koordqos.testing.mock_nri.protocol import go_frame_check

# the registration example (docs/behaviour-nri.md, "Frames the runtime can read"): RegisterPlugin{demo, 10}
# on conn 2, stream 1, timeout 5 s
REGISTER_WIRE = bytes.fromhex(
    "00000002"
    "0000004a"
    "00000040"
    "00000001"
    "01"
    "00"
    "0a1c"
    + b"nri.pkg.api.v1alpha1.Runtime".hex()
    + "120e"
    + b"RegisterPlugin".hex()
    + "1a0a0a04"
    + b"demo".hex()
    + "1202"
    + b"10".hex()
    + "2080e497d012"
)


def _register_bytes() -> bytes:
    payload = api.RegisterPluginRequest(plugin_name="demo", plugin_idx="10").SerializeToString()
    env = encode_request("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", payload, 5_000_000_000)
    return b"".join(frames_for(2, encode_message(1, MessageType.REQUEST, env)))


def test_register_plugin_matches_the_spec_bytes() -> None:
    assert _register_bytes() == REGISTER_WIRE


def test_empty_response_is_a_bare_header() -> None:
    wire = b"".join(frames_for(2, encode_message(1, MessageType.RESPONSE, encode_response())))
    assert wire == bytes.fromhex("000000020000000a00000000000000010200")


def test_configure_response_bytes() -> None:
    body = encode_response(api.ConfigureResponse(events=0x89).SerializeToString())
    wire = b"".join(frames_for(1, encode_message(1, MessageType.RESPONSE, body)))
    assert wire == bytes.fromhex("000000010000000f000000050000000102001203108901")


def test_unimplemented_body() -> None:
    body = encode_response(code=Code.UNIMPLEMENTED, message="method Foo")
    assert body == bytes.fromhex("0a0e080c120a") + b"method Foo"
    resp = decode_response(body)
    assert (resp.status.code, resp.status.message, resp.payload) == (12, "method Foo", b"")


def test_decoders_parse_the_register_request() -> None:
    frames = MuxDecoder().feed(REGISTER_WIRE)
    assert [c for c, _ in frames] == [2]
    (msg,) = TtrpcDecoder().feed(frames[0][1])
    assert (msg.stream_id, msg.type, msg.flags) == (1, MessageType.REQUEST, 0)
    req = decode_request(msg.data)
    assert (req.service, req.method, req.timeout_nano) == (
        "nri.pkg.api.v1alpha1.Runtime",
        "RegisterPlugin",
        5e9,
    )
    assert api.RegisterPluginRequest.FromString(req.payload).plugin_idx == "10"


def test_zero_length_message_decodes() -> None:
    assert TtrpcDecoder().feed(encode_message(7, MessageType.RESPONSE, b"")) == [
        Message(7, MessageType.RESPONSE, 0, b"")
    ]


@pytest.mark.parametrize(
    ("size", "frames"),
    [(0, [10]), (GO_READ_BUFFER - 10, [4096]), (GO_READ_BUFFER - 9, [4096, 1]), (10_000, [4096, 5914])],
)
def test_sending_rule(size: int, frames: list[int]) -> None:
    msg = encode_message(1, MessageType.RESPONSE, b"x" * size)
    out = frames_for(1, msg)
    assert [len(f) - 8 for f in out] == frames
    assert b"".join(f[8:] for f in out) == msg


def test_largest_message_is_two_frames() -> None:
    out = frames_for(1, encode_message(1, MessageType.RESPONSE, b"\0" * MAX_DATA_SIZE))
    assert [len(f) - 8 for f in out] == [4096, MAX_DATA_SIZE + 10 - 4096]


def test_oversize_message_is_refused_both_ways() -> None:
    with pytest.raises(ProtocolError):
        encode_message(1, MessageType.RESPONSE, b"\0" * (MAX_DATA_SIZE + 1))
    header = (MAX_DATA_SIZE + 1).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x01\x00"
    with pytest.raises(ProtocolError, match="4 MiB"):
        TtrpcDecoder().feed(header)


def test_oversize_frame_is_refused() -> None:
    with pytest.raises(ProtocolError):
        MuxDecoder().feed(encode_frame(1, b"")[:4] + (MAX_FRAME_PAYLOAD + 1).to_bytes(4, "big"))


def test_unknown_conn_ids_are_dropped_and_counted() -> None:
    dec = MuxDecoder()
    out = dec.feed(encode_frame(3, b"abc") + encode_frame(0, b"") + encode_frame(1, b"ok"))
    assert out == [(1, b"ok")]
    assert dec.dropped == 2


def test_server_stream_rules() -> None:
    s = ServerStreams()
    s.accept(1)
    s.accept(5)
    with pytest.raises(ProtocolError, match="even"):
        s.accept(6)
    with pytest.raises(ProtocolError, match="reused"):
        s.accept(5)
    with pytest.raises(ProtocolError, match="reused"):
        s.accept(3)


def test_client_streams_are_odd_and_increasing() -> None:
    c = ClientStreams()
    assert [c.next() for _ in range(4)] == [1, 3, 5, 7]


def test_bad_envelopes_raise_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode_request(b"\x0a\xff")
    with pytest.raises(ProtocolError):
        decode_response(b"\x12\x05ab")


def test_go_frame_check() -> None:
    dec = TtrpcDecoder()
    big = encode_message(1, MessageType.RESPONSE, b"y" * 9000)
    with pytest.raises(ProtocolError, match="ENOMEM"):
        go_frame_check(1, big, dec)
    a, b = (f[8:] for f in frames_for(1, big))
    go_frame_check(1, a, dec)
    dec.feed(a)
    go_frame_check(1, b, dec)  # the rest of a message may be large
    with pytest.raises(ProtocolError, match="tail"):
        go_frame_check(1, b + encode_message(3, 2, b""), dec)
    two = encode_message(1, 2, b"") + encode_message(3, 2, b"")
    with pytest.raises(ProtocolError, match="more than one"):
        go_frame_check(1, two, TtrpcDecoder())


# -- property tests -------------------------------------------------------------------------------

_messages = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]), st.binary(max_size=600)),
    min_size=1,
    max_size=8,
)


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


@settings(max_examples=200, deadline=None)
@given(_messages, st.lists(st.integers(0, 10_000), max_size=20))
def test_ttrpc_arbitrary_splits_decode_identically(
    msgs: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(encode_message(sid, t, d) for sid, t, d in msgs)
    dec = TtrpcDecoder()
    out = [m for piece in _splits(stream, cuts) for m in dec.feed(piece)]
    assert [(m.stream_id, m.type, m.data) for m in out] == msgs
    assert dec.buffered == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=9000)), min_size=1, max_size=6),
    st.lists(st.integers(0, 100_000), max_size=20),
)
def test_mux_arbitrary_splits_decode_identically(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(f for conn, data in frames for f in frames_for(conn, data))
    dec = MuxDecoder()
    out = [fr for piece in _splits(stream, cuts) for fr in dec.feed(piece)]
    per_conn: dict[int, bytes] = {1: b"", 2: b""}
    for conn, payload in out:
        per_conn[conn] += payload
    for conn in (1, 2):
        assert per_conn[conn] == b"".join(d for c, d in frames if c == conn)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=10))
def test_random_bytes_only_raise_protocol_error(chunks: list[bytes]) -> None:
    mux, ttrpc = MuxDecoder(), TtrpcDecoder()
    for chunk in chunks:
        for decoder in (mux.feed, ttrpc.feed, decode_request, decode_response):
            try:
                decoder(chunk)
            except ProtocolError:
                pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=70_000))
def test_hand_built_success_envelope_is_what_protobuf_serializes(payload: bytes) -> None:
    from koordqos.nri.api import ttrpc_pb2

    want = ttrpc_pb2.Response(payload=payload).SerializeToString()
    assert encode_response(payload) == want
    assert decode_response(encode_response(payload)).payload == payload


def test_create_container_reply_field_is_what_protobuf_serializes() -> None:
    from koordqos.nri.ttrpc import bytes_field

    adjust = api.ContainerAdjustment()
    adjust.linux.resources.cpu.shares.value = 1024
    adjust.linux.resources.memory.limit.value = 4 << 30
    adjust.env.add(key="K" * 300, value="v")  # a length over one varint byte
    want = api.CreateContainerResponse(adjust=adjust).SerializeToString()
    assert bytes_field(1, adjust.SerializeToString()) == want
    assert api.CreateContainerResponse.FromString(want).adjust == adjust
