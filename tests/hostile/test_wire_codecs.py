"""Hostile bytes against the sans-I/O wire codecs (NRI mux framing, ttrpc messages and envelopes): only
ProtocolError comes out, and feeding a stream in pieces gives what feeding it whole gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.errors import ProtocolError
from koordqos.nri.mux import MuxDecoder, encode_frame
from koordqos.nri.ttrpc import TtrpcDecoder, decode_request, decode_response, encode_message, encode_request
from koordqos.testing.pieces import split_at

valid_messages = st.lists(
    st.tuples(
        st.integers(0, 2**32 - 1).filter(lambda i: i % 2),
        st.sampled_from([1, 2, 3]),
        st.binary(max_size=300),
    ),
    max_size=8,
)


def _feed_all(decoder: TtrpcDecoder | MuxDecoder, chunks: list[bytes]) -> tuple[list[object], bool]:
    out: list[object] = []
    try:
        for chunk in chunks:
            out.extend(decoder.feed(chunk))
    except ProtocolError:
        return out, True
    return out, False


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2000), cuts=st.lists(st.integers(0, 4000), max_size=10))
def test_arbitrary_bytes_give_frames_or_protocol_error_in_any_split(data: bytes, cuts: list[int]) -> None:
    whole = _feed_all(MuxDecoder(), [data])
    pieces = _feed_all(MuxDecoder(), split_at(data, cuts))
    assert whole == pieces
    whole_t = _feed_all(TtrpcDecoder(), [data])
    assert whole_t == _feed_all(TtrpcDecoder(), split_at(data, cuts))


@settings(max_examples=150, deadline=None)
@given(msgs=valid_messages, cuts=st.lists(st.integers(0, 5000), max_size=12), noise=st.binary(max_size=40))
def test_valid_streams_round_trip_and_trailing_noise_never_raises_anything_else(
    msgs: list[tuple[int, int, bytes]], cuts: list[int], noise: bytes
) -> None:
    stream = b"".join(encode_message(sid, mtype, data) for sid, mtype, data in msgs)
    decoded, failed = _feed_all(TtrpcDecoder(), split_at(stream, cuts))
    assert not failed
    assert [(m.stream_id, m.type, m.data) for m in decoded] == msgs  # type: ignore[attr-defined]
    framed = encode_frame(1, stream)
    frames, failed = _feed_all(MuxDecoder(), [*split_at(framed, cuts), noise])
    # the frame is complete before the noise arrives; the noise may or may not be a broken header (both
    # fine: only ProtocolError may escape)
    assert frames[:1] == [(1, stream)]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=500))
def test_envelope_decoders_raise_only_protocol_error(data: bytes) -> None:
    for decode in (decode_request, decode_response):
        try:
            decode(data)
        except ProtocolError:
            pass


def test_a_request_envelope_round_trips() -> None:
    req = decode_request(encode_request("svc", "Method", b"\x01\x02", 5))
    assert (req.service, req.method, req.payload, req.timeout_nano) == ("svc", "Method", b"\x01\x02", 5)
