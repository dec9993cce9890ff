"""Answer: one call's reply, now or later, written by the connection before the work the call left."""

from __future__ import annotations

import asyncio

import pytest

from koordqos.nri.answer import Answer
from koordqos.nri.connection import NRIConnection
from koordqos.nri.mux import MuxDecoder, frames_for
from koordqos.nri.ttrpc import (
    MessageType,
    RequestEnvelope,
    TtrpcDecoder,
    decode_response,
    encode_message,
    encode_request,
    encode_response,
)
from koordqos.testing.poll import wait_until


def _request(stream: int) -> bytes:
    env = encode_request("svc", "Method", b"", 1_000_000_000)
    return b"".join(frames_for(1, encode_message(stream, MessageType.REQUEST, env)))


class _Sink:
    """A transport that logs its writes into a shared trace."""

    def __init__(self, trace: list[str]) -> None:
        self.trace = trace
        self.closing = False
        self.written: list[bytes] = []

    def writelines(self, frames: list[bytes]) -> None:
        self.written.append(b"".join(frames))
        self.trace.append("write")

    def is_closing(self) -> bool:
        return self.closing


def _payloads(written: list[bytes]) -> list[bytes]:
    dec = TtrpcDecoder()
    msgs = [m for w in written for _, frame in MuxDecoder().feed(w) for m in dec.feed(frame)]
    return [bytes(decode_response(m.data).payload) for m in msgs]


def test_then_runs_in_order_once_and_a_nested_answer_shares_the_work() -> None:
    trace: list[object] = []
    answer = Answer(b"r")
    answer.then(trace.append, 1)
    nested = Answer(after=answer.after)
    nested.then(trace.append, 2)
    assert trace == []
    answer.replied()
    answer.replied()
    assert trace == [1, 2]


async def test_an_answer_at_once_is_written_before_its_after_work_in_the_read_callback() -> None:
    trace: list[str] = []

    def handler(req: RequestEnvelope, received: float) -> Answer:
        answer = Answer(encode_response(b"now"))
        answer.then(trace.append, "after")
        return answer

    conn = NRIConnection(handler)
    sink = _Sink(trace)
    conn.connection_made(sink)  # type: ignore[arg-type]
    conn.data_received(_request(1))
    assert trace == ["write", "after"]
    assert _payloads(sink.written) == [b"now"]


async def test_an_answer_later_is_written_on_a_task_then_its_after_work_runs() -> None:
    trace: list[str] = []
    gate = asyncio.Event()

    async def reply(answer: Answer) -> bytes:
        await gate.wait()
        answer.then(trace.append, "after")  # left while waiting: still after the write
        return encode_response(b"later")

    def handler(req: RequestEnvelope, received: float) -> Answer:
        answer = Answer()
        answer.later = reply(answer)
        return answer

    conn = NRIConnection(handler)
    sink = _Sink(trace)
    conn.connection_made(sink)  # type: ignore[arg-type]
    conn.data_received(_request(1))
    assert trace == []  # waiting on its task
    gate.set()
    await wait_until(lambda: trace == ["write", "after"], timeout=5, message=lambda: f"trace {trace}")
    assert _payloads(sink.written) == [b"later"]


@pytest.mark.parametrize("later", [False, True])
async def test_after_work_runs_even_when_the_reply_is_dropped(later: bool) -> None:
    """The peer is gone: nobody to answer, but what the call left (bookkeeping, records) still runs."""
    trace: list[str] = []

    async def reply() -> bytes:
        return encode_response()

    def handler(req: RequestEnvelope, received: float) -> Answer:
        answer = Answer(encode_response(), reply() if later else None)
        answer.then(trace.append, "after")
        return answer

    conn = NRIConnection(handler)
    sink = _Sink(trace)
    sink.closing = True
    conn.connection_made(sink)  # type: ignore[arg-type]
    conn.data_received(_request(1))
    await wait_until(lambda: trace == ["after"], timeout=5, message=lambda: f"trace {trace}")
    assert sink.written == []
