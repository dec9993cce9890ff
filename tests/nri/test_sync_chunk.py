"""SyncChunk: a large Synchronize chunk decoded field by field, in slices, to the same result as upb."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.payload import MalformedPayload
from koordqos.nri.sync import BULK_DECODE_BYTES, SyncChunk
from koordqos.testing.loopturns import counting
from koordqos.testing.mock_nri.samples import sample_node


def _decode_sliced(payload: bytes) -> tuple[SyncChunk, int]:
    chunk = SyncChunk(payload)
    slices = 1
    while not chunk.decode(time.perf_counter()):  # a slice already over: one element per slice
        slices += 1
    return chunk, slices


def test_a_large_chunk_decodes_element_by_element_to_what_upb_decodes() -> None:
    pods, ctrs = sample_node(30, 10)
    req = api.SynchronizeRequest(pods=pods, containers=ctrs, more=True)
    payload = req.SerializeToString()
    assert len(payload) > BULK_DECODE_BYTES  # the field-by-field path
    chunk, slices = _decode_sliced(payload)
    assert slices == len(pods) + len(ctrs) + 1  # one field each (the last is `more`): slices really stop
    assert chunk.pods == list(req.pods)
    assert chunk.containers == list(req.containers)
    assert chunk.more is True


def test_a_small_chunk_decodes_in_one_go() -> None:
    pods, ctrs = sample_node(2, 2)
    chunk, slices = _decode_sliced(api.SynchronizeRequest(pods=pods, containers=ctrs).SerializeToString())
    assert slices == 1
    assert (len(chunk.pods), len(chunk.containers), chunk.more) == (2, 4, False)


def _big() -> bytes:
    pods, ctrs = sample_node(30, 10)
    return api.SynchronizeRequest(pods=pods, containers=ctrs).SerializeToString()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:-7],  # truncated inside the last container
        lambda b: b + b"\x12\xff\xff\xff\x0f",  # a field longer than the message
        lambda b: b + b"\x00\x01",  # field number 0
        lambda b: b + b"\x0b",  # a group (wire type 3)
        lambda b: b + b"\x12\x02\xff\xff",  # a container that is not a message
        lambda b: b + b"\x18" + b"\xff" * 11,  # an over-long varint
    ],
)
def test_malformed_large_chunks_raise_malformed_payload(mutate: object) -> None:
    payload = mutate(_big())  # type: ignore[operator]
    with pytest.raises(MalformedPayload, match="Synchronize"):
        _decode_sliced(payload)


def test_unknown_fields_are_skipped_like_upb_does() -> None:
    payload = _big() + b"\x20\x05" + b"\x2a\x03abc" + b"\x31" + b"\x00" * 8 + b"\x3d" + b"\x00" * 4
    chunk, _ = _decode_sliced(payload)
    ref = api.SynchronizeRequest.FromString(payload)
    assert (chunk.pods, chunk.containers, chunk.more) == (list(ref.pods), list(ref.containers), ref.more)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_whatever_the_sliced_decoder_accepts_upb_accepts_the_same(data: st.DataObject) -> None:
    payload = bytearray(_big())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))
    try:
        chunk, _ = _decode_sliced(bytes(payload))
    except MalformedPayload:
        return
    ref = api.SynchronizeRequest.FromString(bytes(payload))
    assert (chunk.pods, chunk.containers, chunk.more) == (list(ref.pods), list(ref.containers), ref.more)


def test_update_for_finds_entries_appended_directly_and_keeps_the_first() -> None:
    from koordqos.nri.calls import NRISynchronize

    ev = NRISynchronize()
    a = ev.update_for("a")
    assert ev.update_for("a") is a
    direct = api.ContainerUpdate(container_id="b")
    ev.updates.append(direct)  # a handler may append to `updates` itself
    ev.updates.append(api.ContainerUpdate(container_id="b"))  # a later duplicate: the first one wins
    assert ev.update_for("b") is direct
    c = ev.update_for("c")
    assert [u.container_id for u in ev.updates] == ["a", "b", "b", "c"]
    assert ev.update_for("c") is c
    many = NRISynchronize()
    for i in range(3000):  # linear, not quadratic: the index answers
        many.update_for(f"c{i}").linux.resources.cpu.shares.value = i + 2
    assert many.update_for("c2999").linux.resources.cpu.shares.value == 3001
    assert len(many.updates) == 3000


async def test_a_synchronize_s_messages_are_released_over_several_loop_steps() -> None:
    # freed at once when the handler returned, 2,500 containers' messages were ~6 ms in one step
    from koordqos.nri.sync import release

    pods, ctrs = sample_node(50, 50)
    async with counting() as turns:
        await release(ctrs, pods)
    assert ctrs == []
    assert pods == []
    assert turns.count >= 3  # before each list and after the last: the reply's write is its own step


def test_drop_index_lets_the_updates_go_and_lookups_still_work() -> None:
    from koordqos.nri.calls import NRISynchronize

    ev = NRISynchronize()
    first = ev.update_for("a")
    ev.update_for("b")
    ev.drop_index()
    assert ev._index == {}  # the updates list is now their only holder
    assert ev.update_for("a") is first  # re-indexed from the list
    ev.drop_index()
    ev.updates.clear()
    assert ev.update_for("a") is not first
    assert [u.container_id for u in ev.updates] == ["a"]
