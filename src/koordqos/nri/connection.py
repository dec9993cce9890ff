"""NRIConnection: the asyncio Protocol that runs the mux and ttrpc codecs over one socket.

One side serves requests on one logical connection and calls the peer on the other: the plugin serves
conn 1 and calls on conn 2, the (mock) runtime the reverse. The handler gives each request's `Answer`
(koordqos.nri.answer): one answered at once is answered from `data_received` itself; one that has to wait
(`Answer.later`) runs in its own task, so responses may go out of order; calls are matched to responses by
stream id. Either way the reply is written first, then the work the call left for after it runs. Every
outgoing ttrpc message is written in one `writelines` of the frames `mux.frames_for` gives, so frames never
interleave; a writer that meets a full transport buffer waits under the write lock, and while one does,
replies queue behind it.

Any `ProtocolError` while reading (malformed frame, oversize message, bad envelope, stream-id violation,
a frame a Go reader could not take) drops the connection: it is logged once, counted, and `closed`
completes with the error so the owner can re-establish it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import cast

import structlog

from koordqos.errors import KoordQoSError, ProtocolError, TimeoutException, detached
from koordqos.nri import telemetry as m
from koordqos.nri.answer import Answer
from koordqos.nri.api import ttrpc_pb2
from koordqos.nri.busypoll import BusyPoll
from koordqos.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, MuxDecoder, frames_for
from koordqos.nri.ttrpc import (
    MAX_DATA_SIZE,
    ClientStreams,
    Code,
    Message,
    MessageType,
    RequestEnvelope,
    ServerStreams,
    TtrpcDecoder,
    decode_request,
    decode_response,
    encode_message,
    encode_request,
    encode_response,
)
from koordqos.once import SeenOnce

log = structlog.get_logger("koordqos.nri")
_envelope_seen: SeenOnce[str] = SeenOnce()  # roles whose malformed envelope was logged

# handler(request envelope, monotonic time the request was decoded) -> its Answer (the serialized Response
# envelope, now or later, and what runs once it is written)
RequestHandler = Callable[[RequestEnvelope, float], Answer]
# frame_check(conn_id, payload, that conn's decoder before the payload is fed) raises ProtocolError
FrameCheck = Callable[[int, bytes, TtrpcDecoder], None]


class ConnectionClosedError(KoordQoSError):
    """The NRI connection closed while a call was outstanding (or before it was sent)."""


class NRIConnection(asyncio.Protocol):
    """Mux + ttrpc over one stream socket: serve `serve_conn`, call the peer on `client_conn`."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        role: str = "plugin",
        serve_conn: int = PLUGIN_SERVICE_CONN,
        client_conn: int = RUNTIME_SERVICE_CONN,
        frame_check: FrameCheck | None = None,
        busy_poll: float = 0.0,
        busy_poll_gate: Callable[[], bool] | None = None,
    ) -> None:
        self._handler = handler
        self._busy = BusyPoll(busy_poll, busy_poll_gate)
        self.role = role
        self.serve_conn = serve_conn
        self.client_conn = client_conn
        self._frame_check = frame_check
        # large frames streamed to the ttrpc decoder, except where whole frames are checked (the mock runtime)
        self._mux = MuxDecoder(frozenset({serve_conn, client_conn}), stream=frame_check is None)
        self._decoders = {serve_conn: TtrpcDecoder(), client_conn: TtrpcDecoder()}
        self._server_streams = ServerStreams()
        self._client_streams = ClientStreams()
        self._pending: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._transport: asyncio.Transport | None = None
        self._write_lock = asyncio.Lock()
        self._can_write = asyncio.Event()
        self._can_write.set()
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[BaseException | None] = loop.create_future()
        self.error: BaseException | None = None
        self.bytes_received = 0

    @property
    def busy_poll(self) -> BusyPoll:
        """The polling window after this connection's replies."""
        return self._busy

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Store the transport."""
        # a stream transport (uvloop's do not subclass asyncio.Transport, hence no isinstance check)
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """Demultiplex and decode; drop the connection on any protocol violation."""
        if self.error is not None:
            return
        self.bytes_received += len(data)
        try:
            for conn_id, payload in self._mux.feed(data):
                decoder = self._decoders[conn_id]
                if self._frame_check is not None:
                    self._frame_check(conn_id, payload, decoder)
                for msg in decoder.feed(payload):
                    self._dispatch(conn_id, msg)
                    if self.error is not None:
                        return
        except ProtocolError as exc:
            self.fail(exc)
        if self._mux.dropped:
            m.DROPPED_MESSAGES.labels(self.role, "unknown_conn").inc(self._mux.dropped)
            self._mux.dropped = 0

    def eof_received(self) -> bool | None:
        """The peer closed: close our side too."""
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail outstanding calls, cancel request handlers, complete `closed`."""
        self._transport = None
        self._busy.stop()
        self._can_write.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosedError(f"NRI connection closed ({self.role})"))
        self._pending.clear()
        for task in list(self._tasks):
            task.cancel()
        if not self.closed.done():
            if self.error is not None:
                self.closed.set_result(self.error)
            else:
                self.closed.set_result(None if exc is None else detached(exc))

    def pause_writing(self) -> None:
        """The transport buffer is full: make senders wait."""
        self._can_write.clear()

    def resume_writing(self) -> None:
        """The transport buffer drained."""
        self._can_write.set()

    # -- reading ----------------------------------------------------------------------------------

    def _dispatch(self, conn_id: int, msg: Message) -> None:
        if conn_id == self.serve_conn:
            if msg.type != MessageType.REQUEST:
                m.DROPPED_MESSAGES.labels(self.role, f"type{msg.type}_on_server_conn").inc()
                return
            received = time.monotonic()
            self._busy.received()
            self._server_streams.accept(msg.stream_id)
            try:
                req = decode_request(msg.data)
            except ProtocolError as exc:
                # the frame is intact, only this envelope is not: answer it (ttrpc's "unmarshal request
                # error", INVALID_ARGUMENT) and keep the connection
                m.MALFORMED_REQUESTS.labels(self.role, "(envelope)").inc()
                if _envelope_seen.first(self.role):
                    log.warning("malformed ttrpc request envelope answered", role=self.role, error=str(exc))
                reply = encode_response(code=Code.INVALID_ARGUMENT, message=f"unmarshal request error: {exc}")
                task = asyncio.get_running_loop().create_task(self._send_reply(msg.stream_id, reply))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            try:
                answer = self._handler(req, received)
            except ProtocolError as exc:
                self.fail(exc)
                return
            except Exception as exc:
                answer = Answer(self._internal_error(req, exc))
            later = answer.later
            if later is None:
                self._reply_now(msg.stream_id, req, answer.reply)
                self._replied(answer)
                self._busy.replied()
                return
            answer.later = None  # the task holds it now (the answer and its coroutine do not keep each other)
            task = asyncio.get_running_loop().create_task(self._serve(msg.stream_id, req, later, answer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if msg.type != MessageType.RESPONSE:
            m.DROPPED_MESSAGES.labels(self.role, f"type{msg.type}_on_client_conn").inc()
            return
        fut = self._pending.pop(msg.stream_id, None)
        if fut is None or fut.done():
            # like Go's "received message on inactive stream": a late reply after we gave up
            m.DROPPED_MESSAGES.labels(self.role, "inactive_stream").inc()
            return
        fut.set_result(decode_response(msg.data))

    def _replied(self, answer: Answer) -> None:
        """The reply is written (or dropped): run what the call left for after it."""
        try:
            answer.replied()
        except Exception as exc:  # a bug of the owner's bookkeeping must not drop the connection
            log.error(
                "NRI after-reply step failed",
                role=self.role,
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )

    def _internal_error(self, req: RequestEnvelope, exc: Exception) -> bytes:
        log.error(
            "NRI request handler failed",
            role=self.role,
            method=req.method,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
        return encode_response(code=Code.INTERNAL, message=f"{type(exc).__name__}: {exc}")

    def _checked(self, req: RequestEnvelope, reply: bytes) -> bytes:
        if len(reply) > MAX_DATA_SIZE:
            # the peer would refuse it (and kill the connection): say so with a status it can handle
            log.error("NRI reply too large", role=self.role, method=req.method, size=len(reply))
            reply = encode_response(
                code=Code.RESOURCE_EXHAUSTED,
                message=f"reply of {len(reply)} bytes exceeds the {MAX_DATA_SIZE}-byte ttrpc limit",
            )
        return reply

    def _reply_now(self, stream_id: int, req: RequestEnvelope, reply: bytes) -> None:
        """Write the reply from here when nothing is waiting to write, else queue it behind the waiter."""
        reply = self._checked(req, reply)
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # the peer is gone: nobody to answer (as `_send_reply` on a closed connection)
        if self._can_write.is_set() and not self._write_lock.locked():
            transport.writelines(
                frames_for(self.serve_conn, encode_message(stream_id, MessageType.RESPONSE, reply))
            )
            return
        task = asyncio.get_running_loop().create_task(self._send_reply(stream_id, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, stream_id: int, req: RequestEnvelope, later: Awaitable[bytes], answer: Answer
    ) -> None:
        try:
            try:
                reply = await later
            except ProtocolError as exc:
                self.fail(exc)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reply = self._internal_error(req, exc)
            await self._send_reply(stream_id, self._checked(req, reply))
        finally:
            # written, dropped, or the connection went: what the call left for after its reply runs now
            self._replied(answer)

    async def _send_reply(self, stream_id: int, reply: bytes) -> None:
        try:
            await self.send(self.serve_conn, stream_id, MessageType.RESPONSE, reply)
        except ConnectionClosedError:
            return
        self._busy.replied()

    # -- writing ----------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the transport is still usable."""
        return self._transport is not None and not self._transport.is_closing()

    async def send(self, conn_id: int, stream_id: int, mtype: int, data: bytes) -> None:
        """Write one ttrpc message under the sending rule and the write lock."""
        frames = frames_for(conn_id, encode_message(stream_id, mtype, data))
        async with self._write_lock:
            transport = self._transport
            if transport is None or transport.is_closing():
                raise ConnectionClosedError(f"NRI connection closed ({self.role})")
            transport.writelines(frames)
            if not self._can_write.is_set():
                await self._can_write.wait()

    def write_raw(self, data: bytes) -> None:
        """Write bytes bypassing the codecs (tests and the mock runtime inject malformed input with it)."""
        if self._transport is None or self._transport.is_closing():
            raise ConnectionClosedError(f"NRI connection closed ({self.role})")
        self._transport.write(data)

    async def call(self, service: str, method: str, payload: bytes, timeout: float) -> ttrpc_pb2.Response:
        """Call `service/method` on the peer; TimeoutException after `timeout` seconds."""
        sid = self._client_streams.next()
        fut: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._pending[sid] = fut
        try:
            await self.send(
                self.client_conn,
                sid,
                MessageType.REQUEST,
                encode_request(service, method, payload, int(timeout * 1e9)),
            )
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise TimeoutException(f"{method} got no reply within {timeout * 1000:.0f} ms") from None
        finally:
            self._pending.pop(sid, None)

    # -- closing ----------------------------------------------------------------------------------

    def fail(self, exc: ProtocolError) -> None:
        """Drop the connection for a protocol violation: logged once, counted."""
        if self.error is not None:
            return
        self.error = detached(exc)
        m.PROTOCOL_ERRORS.labels(self.role).inc()
        log.warning(
            "NRI protocol error; dropping the connection",
            role=self.role,
            error=str(exc),
            bytes_received=self.bytes_received,
        )
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """Close the socket cleanly (pending writes are flushed)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    async def wait_closed(self) -> BaseException | None:
        """Wait until the connection is gone; returns the error that closed it, if any."""
        return await asyncio.shield(self.closed)
