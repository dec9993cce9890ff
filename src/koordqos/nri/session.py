"""PluginSession: one NRI connection's plugin service: configure, synchronize and the lifecycle calls.

It serves the plugin service on conn 1 from the moment the socket is connected (Configure may arrive before
the RegisterPlugin reply), answers Configure with an explicit event mask, collects chunked Synchronize
requests (echoing `more`), and turns every lifecycle call (dedicated RPC or the StateChange fallback) into an
NRI call record (koordqos.nri.calls) that the plugin's handler serves inside the hook core's `run_call`, with
a deadline of the runtime's request timeout minus a safety margin. Unknown methods get UNIMPLEMENTED.
NodeState's runtime view changes with every call: a sandbox is published before its handler runs, a removal
after it; a container's record (created, started, updated, stopped) is published right after the reply is
written when the call was answered at once — its hooks read pods, the Node and the NodeSLO, never the
runtime record of the container being handled, so the runtime need not wait for that bookkeeping — and
before the handler runs otherwise. Either way it happens before the next request is read; a record equal
to the one NodeState holds is not published again.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import structlog
import yaml
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.config import FailurePolicy
from koordqos.errors import ConfigError, HookError, ProtocolError, TimeoutException
from koordqos.events.types import (
    Event,
    NRIConnectionChanged,
    RuntimeContainer,
    RuntimeContainerRemoved,
    RuntimeContainerUpserted,
    RuntimeSandbox,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
    SourceSynced,
)
from koordqos.hooks.core import Call, call_deadline, start_call
from koordqos.nri import telemetry as m
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import (
    SYNC_SLICE_SECONDS,
    NRICall,
    NRICreateContainer,
    NRIPodEvent,
    NRIRemoveContainer,
    NRIRemovePodSandbox,
    NRIRunPodSandbox,
    NRIStartContainer,
    NRIStopContainer,
    NRIStopPodSandbox,
    NRISynchronize,
    NRIUpdateContainer,
)
from koordqos.nri.connection import NRIConnection
from koordqos.nri.limits import RuntimeObjectLimits
from koordqos.nri.mask import VALID_EVENTS_LEGACY, parse_event_mask, validate_event_mask
from koordqos.nri.runtime_objects import runtime_container, runtime_sandbox
from koordqos.nri.ttrpc import (
    WIRE_LEN,
    WIRE_VARINT,
    BytesLike,
    Code,
    RequestEnvelope,
    bytes_field,
    encode_response,
    next_field,
    read_varint,
)
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.nri")

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
DEFAULT_REQUEST_TIMEOUT = 2.0  # seconds, when Configure does not say (runtimes before NRI v0.7)
DEFAULT_REGISTRATION_TIMEOUT = 5.0

NRIHandler = Callable[[NRICall, NodeState, Call], Awaitable[None] | None]


def no_hooks(event: NRICall, state: NodeState, call: Call) -> None:
    """The handler of a plugin without runtime hooks: every reply stays empty."""


class SessionOwner(Protocol):
    """What a session needs from the plugin that runs it (state kept across sessions)."""

    bus: EventBus
    handler: NRIHandler
    events_mask: int
    failure_policy: FailurePolicy
    syncs: int
    timings: dict[str, list[float]] | None
    limits: RuntimeObjectLimits

    def set_status(self, value: str) -> None: ...


class _ErrorReply(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


P = TypeVar("P", bound=ProtoMessage)
# A method handler returns the reply payload, or (when something had to wait) a coroutine giving it.
Reply = bytes | Coroutine[Any, Any, bytes]
Handler = Callable[[BytesLike, float, int], Reply]


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


_malformed_seen: SeenOnce[str] = SeenOnce()

BULK_DECODE_BYTES = 128 << 10  # Synchronize chunks up to this size are decoded in one go (≈ 0.5 ms)


class SyncChunk:
    """One Synchronize chunk, decoded in slices: a chunk of a few MB (up to the 4 MiB ttrpc limit: NRI
    splits larger syncs) costs upb 10–20 ms in one go, so a large one is walked field by field and its
    pods and containers decoded one by one until a slice's time is up. Malformed input raises
    MalformedPayload, as `parse_payload` does."""

    __slots__ = ("_data", "_pos", "containers", "more", "pods")

    def __init__(self, payload: BytesLike) -> None:
        self._data = payload
        self._pos = 0
        self.pods: list[api.PodSandbox] = []
        self.containers: list[api.Container] = []
        self.more = False

    def decode(self, until: float) -> bool:
        """Decode until `until` (perf_counter) passes; True once the whole chunk is decoded."""
        data = self._data
        if self._pos == 0 and len(data) <= BULK_DECODE_BYTES:
            req = parse_payload(api.SynchronizeRequest, data, "Synchronize")
            self.pods, self.containers, self.more = list(req.pods), list(req.containers), req.more
            self._pos = len(data)
            return True
        pos, end = self._pos, len(data)
        clock = time.perf_counter
        try:
            while pos < end:
                number, wire, start, stop = next_field(data, pos)
                if wire == WIRE_LEN and number == 1:
                    self.pods.append(parse_payload(api.PodSandbox, data[start:stop], "Synchronize"))
                elif wire == WIRE_LEN and number == 2:
                    self.containers.append(parse_payload(api.Container, data[start:stop], "Synchronize"))
                elif wire == WIRE_VARINT and number == 3:
                    self.more = read_varint(data, start)[0] != 0
                # any other field: unknown to this schema, skipped (as protobuf keeps it aside)
                pos = stop
                if clock() > until:
                    break
        except ProtocolError as exc:
            raise MalformedPayload(
                f"Synchronize: payload does not parse as SynchronizeRequest: {exc}"
            ) from None
        self._pos = pos
        return pos >= end


class PluginSession:
    """One connection's worth of plugin state and the plugin-service handlers."""

    def __init__(self, plugin: SessionOwner) -> None:
        self.plugin = plugin
        self.bus = plugin.bus
        self.conn: NRIConnection | None = None
        self.registered = False
        self.configured = asyncio.Event()
        self.synced = asyncio.Event()
        self.runtime = ""
        self.nri_version = ""
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT
        self.registration_timeout = DEFAULT_REGISTRATION_TIMEOUT
        self.events_mask = plugin.events_mask
        self._sync_pods: list[api.PodSandbox] = []
        self._sync_containers: list[api.Container] = []
        self._sync_started: float | None = None
        self._fallback_logged: set[int] = set()
        # what the call being answered leaves for after its reply is written (`replied`): state events to
        # publish, a container whose record is still to be built, the call to settle (its timings and
        # decision record); and the request's own accounting (method, outcome, seconds)
        self._after_reply: list[Event | tuple[api.PodSandbox, api.Container, str | None] | Call] = []
        self._served: list[tuple[str, str, float]] = []
        self.methods: dict[str, Handler] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "RunPodSandbox": self._pod_rpc(api.RunPodSandboxRequest, NRIRunPodSandbox),
            "StopPodSandbox": self._pod_rpc(api.StopPodSandboxRequest, NRIStopPodSandbox),
            "RemovePodSandbox": self._pod_rpc(api.RemovePodSandboxRequest, NRIRemovePodSandbox),
            "CreateContainer": self._create_container,
            "StartContainer": self._start_rpc(api.StartContainerRequest, "start"),
            "PostStartContainer": self._start_rpc(api.PostStartContainerRequest, "post_start"),
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "RemoveContainer": self._remove_container,
            "StateChange": self._state_change,
            # not subscribed; answered harmlessly should a runtime send them anyway
            "UpdatePodSandbox": self._noop(api.UpdatePodSandboxRequest),
            "PostUpdatePodSandbox": self._noop(api.PostUpdatePodSandboxRequest),
            "PostCreateContainer": self._noop(api.PostCreateContainerRequest),
            "PostUpdateContainer": self._noop(api.PostUpdateContainerRequest),
            "ValidateContainerAdjustment": self._validate,
        }

    def close(self) -> None:
        """The connection is gone: drop it and the handler table. Both refer back to the session, and a
        reference cycle is freed only by a full collection, never once the agent's GC policy froze it
        (docs/performance.md)."""
        self.conn = None
        self.methods = {}

    # -- dispatch ---------------------------------------------------------------------------------

    def handle(self, req: RequestEnvelope, received: float) -> Reply:
        """Serve one plugin-service request: the Response envelope, or a coroutine giving it when the call
        has to wait for something (the connection then runs it on a task). Calls whose hooks are
        synchronous (CreateContainer and the other container events) are answered right here, without a
        task or a timer."""
        if req.service != PLUGIN_SERVICE:
            m.REQUESTS.labels("(unknown)", "unimplemented").inc()
            return encode_response(code=Code.UNIMPLEMENTED, message=f"service {req.service}")
        handler = self.methods.get(req.method)
        if handler is None:
            m.REQUESTS.labels("(unknown)", "unimplemented").inc()
            log.info("NRI method not implemented", method=req.method)
            return encode_response(code=Code.UNIMPLEMENTED, message=f"method {req.method}")
        try:
            out = handler(req.payload, received, req.timeout_nano)
        except Exception as exc:
            return self._failed(req, received, exc)
        if isinstance(out, bytes):
            reply = encode_response(out)
            # counted once the reply is out (`replied`): nothing but the reply before it
            self._served.append((req.method, "ok", time.monotonic() - received))
            return reply
        self.replied()  # the handler waits: what it published goes out now, before it goes on
        return self._handle_later(req, received, out)

    def replied(self) -> None:
        """The reply of the call just handled is written: count the requests answered, settle their calls
        (timings, decision records) and publish the state events they left behind."""
        served = self._served
        if served:
            self._served = []
            for method, outcome, took in served:
                self._count(method, outcome, took)
        pending = self._after_reply
        if pending:
            self._after_reply = []
            for item in pending:
                if isinstance(item, Call):
                    item.settle()
                elif isinstance(item, tuple):
                    self._publish_container(*item)
                else:
                    self.bus.publish_nowait(item)

    async def _handle_later(
        self, req: RequestEnvelope, received: float, pending: Coroutine[Any, Any, bytes]
    ) -> bytes:
        try:
            payload = await pending
        except Exception as exc:
            return self._failed(req, received, exc)
        finally:
            # what the handler left for after its reply (a call to settle; on the StateChange route a
            # container's events): done now, the reply is written next
            self.replied()
        return self._done(req, received, "ok", encode_response(payload))

    def _failed(self, req: RequestEnvelope, received: float, exc: Exception) -> bytes:
        """The reply for a handler that raised (a ProtocolError is re-raised: the connection goes)."""
        if isinstance(exc, _ErrorReply):
            return self._done(req, received, "error", encode_response(code=exc.code, message=exc.message))
        if isinstance(exc, MalformedPayload):
            # framing intact: answer this request (as ttrpc servers answer an undecodable request) and go on
            m.MALFORMED_REQUESTS.labels("plugin", req.method).inc()
            if _malformed_seen.first(req.method):
                log.warning(
                    "malformed NRI request answered INVALID_ARGUMENT", method=req.method, error=str(exc)
                )
            return self._done(
                req, received, "malformed", encode_response(code=Code.INVALID_ARGUMENT, message=str(exc))
            )
        if isinstance(exc, ProtocolError):
            self._done(req, received, "protocol_error", b"")
            raise exc
        # a bug of ours must not fail the pod (Ignore) nor, on Configure, subscribe us to everything
        log.error(
            "NRI request failed unexpectedly",
            method=req.method,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
        if req.method == "Configure" or self.plugin.failure_policy == "Fail":
            reply = encode_response(code=Code.UNKNOWN, message=f"{type(exc).__name__}: {exc}")
        else:
            reply = encode_response()
        return self._done(req, received, "internal_error", reply)

    def _done(self, req: RequestEnvelope, received: float, outcome: str, reply: bytes) -> bytes:
        self._count(req.method, outcome, time.monotonic() - received)
        return reply

    def _count(self, method: str, outcome: str, took: float) -> None:
        """One request's accounting: its outcome counted, its plugin-side time observed."""
        counter = _REQUESTS.get((method, outcome))
        if counter is None:
            counter = _REQUESTS[(method, outcome)] = m.REQUESTS.labels(method, outcome)
        counter.inc()
        timer = _REQUEST_TIMERS.get(method)
        if timer is None:
            timer = _REQUEST_TIMERS[method] = m.REQUEST_SECONDS.labels(method)
        timer.observe(took)
        if self.plugin.timings is not None:
            self.plugin.timings.setdefault(method, []).append(took)

    def _publish(self, event: Event) -> None:
        # never wait for a full subscriber queue on the reply path: the runtime's clock is running
        self.bus.publish_nowait(event)

    def _request_now(
        self, event: NRICall, received: float, timeout_nano: int, policy: FailurePolicy | None = None
    ) -> Coroutine[Any, Any, None] | None:
        """Serve `event` within the deadline: None when the handler completed here, else a coroutine that
        completes it; under Fail a failure becomes an error reply (_ErrorReply)."""
        deadline = call_deadline(self.request_timeout, time.monotonic() - received, timeout_nano)
        state = self.bus.state
        handler = self.plugin.handler
        try:
            started = start_call(
                type(event).__name__,
                deadline,
                policy or self.plugin.failure_policy,
                lambda call: handler(event, state, call),
                settle=False,
            )
        except (HookError, TimeoutException) as exc:
            # a plain error status, as a Go handler returning an error: the runtime fails the operation
            raise _ErrorReply(Code.UNKNOWN, str(exc)) from None
        if isinstance(started, Call):
            self._after_reply.append(started)  # settled once the reply is written
            return None
        return _awaited_call(started)

    async def _request(
        self, event: NRICall, received: float, timeout_nano: int, policy: FailurePolicy | None = None
    ) -> None:
        """`_request_now` for the handlers that run on a task anyway."""
        pending = self._request_now(event, received, timeout_nano, policy)
        if pending is not None:
            await pending

    def _serve(
        self, event: NRICall, received: float, tn: int, reply: Callable[[], bytes], after: Event | None = None
    ) -> Reply:
        """Serve `event`; the reply payload is `reply()` once the handler completed (here, or later on a
        task); `after` is published then (removals leave NodeState after the hooks ran)."""
        pending = self._request_now(event, received, tn)
        if pending is None:
            if after is not None:
                self._after_reply.append(after)
            return reply()
        return self._reply_later(pending, reply, after)

    async def _reply_later(
        self, pending: Coroutine[Any, Any, None], reply: Callable[[], bytes], after: Event | None
    ) -> bytes:
        await pending
        if after is not None:
            self._publish(after)
        return reply()

    # -- configure / synchronize ------------------------------------------------------------------

    async def _configure(self, payload: BytesLike, received: float, timeout_nano: int) -> bytes:
        req = parse_payload(api.ConfigureRequest, payload, "Configure")
        self.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
        self.nri_version = req.NRI_version
        if req.request_timeout > 0:
            self.request_timeout = req.request_timeout / 1000
        if req.registration_timeout > 0:
            self.registration_timeout = req.registration_timeout / 1000
        mask = self.plugin.events_mask
        if req.config.strip():
            try:
                mask = validate_event_mask(_mask_from_config(req.config))
            except ConfigError as exc:
                log.error("NRI plugin configuration rejected", error=str(exc))
                raise _ErrorReply(Code.INVALID_ARGUMENT, str(exc)) from None
        if _version(req.NRI_version) < (0, 10):
            # no (or a pre-v0.10) NRI version: stay inside the events every runtime knows
            narrowed = mask & VALID_EVENTS_LEGACY
            if narrowed != mask:
                log.warning(
                    "NRI runtime too old for some events; not subscribing to them",
                    dropped=f"{mask & ~narrowed:#x}",
                    nri_version=req.NRI_version or "(none)",
                )
            mask = narrowed
        if mask == 0:
            raise _ErrorReply(Code.INVALID_ARGUMENT, "no NRI event left to subscribe to on this runtime")
        self.events_mask = mask
        self.configured.set()
        self.plugin.set_status("synchronizing")
        log.info(
            "NRI configured",
            runtime=self.runtime,
            nri_version=req.NRI_version or "(unknown)",
            request_timeout_ms=round(self.request_timeout * 1000),
            events=f"{mask:#x}",
        )
        self._publish(NRIConnectionChanged(True, self.runtime))
        obs.NRI_CONNECTED.set(1)
        return api.ConfigureResponse(events=mask).SerializeToString()

    async def _synchronize(self, payload: BytesLike, received: float, timeout_nano: int) -> bytes:
        chunk = SyncChunk(payload)
        while not chunk.decode(time.perf_counter() + SYNC_SLICE_SECONDS):
            await asyncio.sleep(0)  # a multi-MB chunk is decoded in slices, not in one loop step
        if self._sync_started is None:
            self._sync_started = received  # one request timeout covers the whole chunked exchange
        limits = self.plugin.limits  # a runtime could send `more` chunks forever
        self._sync_pods.extend(limits.cap("sandbox", self._sync_pods, chunk.pods))
        self._sync_containers.extend(limits.cap("container", self._sync_containers, chunk.containers))
        more = chunk.more
        del chunk  # its lists hold the messages too; they are freed in slices below (`_release`)
        if more:
            return api.SynchronizeResponse(more=True).SerializeToString()
        started = self._sync_started
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers, self._sync_started = [], [], None
        counts = len(pods), len(containers)  # the lists are emptied by `_release` below
        await self._replace_state(pods, containers)
        event = NRISynchronize(pods=pods, containers=containers, reconnect=self.plugin.syncs > 0)
        # The runtime's timeout_nano already has the time spent on earlier chunks taken off: measured from
        # this chunk then. Without it the first chunk's arrival starts the clock.
        since = received if timeout_nano > 0 else started
        # Always Ignore here: an error reply to Synchronize makes the runtime close the connection, and the
        # same error on every reconnect would keep NRI down for good (koordlet answers Synchronize with no
        # error in every case). What the hooks computed is sent; the reconciler covers the rest.
        await self._request(event, since, timeout_nano, policy="Ignore")
        reply, updates = await _sync_reply(event)
        event.drop_index()  # first: the index holds the updates too, which would then all go at once
        await _release(event.updates, containers, pods)
        self.plugin.syncs += 1
        self.synced.set()
        self.plugin.set_status("connected")
        log.info(
            "NRI synchronized",
            pods=counts[0],
            containers=counts[1],
            updates=updates,
            reconnect=event.reconnect,
        )
        return reply

    async def _replace_state(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        """Make NodeState's runtime view exactly the synchronized one (stale entries from before go): the
        records are built in slices (≈ 10 µs each, thousands of them), then published as one event."""
        # from a fresh step: the one that got here ran the chunk's last decoding slice (two slices in one
        # step were the longest of a large Synchronize)
        await asyncio.sleep(0)
        uid_of = {p.id: p.uid for p in pods}
        sandboxes: list[RuntimeSandbox] = []
        records: list[RuntimeContainer] = []
        clock = time.perf_counter
        until = clock() + SYNC_SLICE_SECONDS
        for i, pod in enumerate(pods):
            sandboxes.append(runtime_sandbox(pod))
            if i % 16 == 15 and clock() > until:
                await asyncio.sleep(0)
                until = clock() + SYNC_SLICE_SECONDS
        for i, ctr in enumerate(containers):
            records.append(runtime_container(ctr, uid_of.get(ctr.pod_sandbox_id, "")))
            if i % 16 == 15 and clock() > until:
                await asyncio.sleep(0)
                until = clock() + SYNC_SLICE_SECONDS
        # NodeState takes in the thousands of records at once (≈ 2 ms for 2,500): a step of its own
        await asyncio.sleep(0)
        self._publish(RuntimeSynchronized(tuple(sandboxes), tuple(records)))
        # in the same step: no subscriber sees the runtime's pods without knowing that they are all of them
        # (local mode's pods come from here: the reconciler's dangling-pod-dir step waits for it)
        self._publish(SourceSynced("nri"))
        await asyncio.sleep(0)

    async def _shutdown(self, payload: BytesLike, received: float, timeout_nano: int) -> bytes:
        log.info("NRI runtime announced shutdown")
        return b""

    # -- lifecycle events -------------------------------------------------------------------------

    async def _pod_event(self, cls: type[NRIPodEvent], pod: api.PodSandbox, received: float, tn: int) -> None:
        if cls is not NRIRemovePodSandbox and self.plugin.limits.admit(
            "sandbox", self.bus.state.sandboxes, pod.id
        ):
            self._publish(RuntimeSandboxUpserted(runtime_sandbox(pod)))
        await self._request(cls(pod), received, tn)
        if cls is NRIRemovePodSandbox:
            self._publish(RuntimeSandboxRemoved(pod.id))

    def _pod_rpc(self, req_cls: type[Any], cls: type[NRIPodEvent]) -> Handler:
        async def handler(payload: BytesLike, received: float, tn: int) -> bytes:
            req = parse_payload(req_cls, payload, req_cls.__name__)
            await self._pod_event(cls, req.pod, received, tn)
            return b""

        return handler

    def _container_upserted(self, pod: api.PodSandbox, ctr: api.Container, state: str | None = None) -> None:
        self._after_reply.append((pod, ctr, state))

    def _publish_container(self, pod: api.PodSandbox, ctr: api.Container, state: str | None) -> None:
        node = self.bus.state
        if not self.plugin.limits.admit("container", node.containers, ctr.id):
            return
        uid = pod.uid or getattr(node.sandboxes.get(ctr.pod_sandbox_id), "uid", "")
        record = runtime_container(ctr, uid, state)
        if node.containers.get(ctr.id) != record:  # the same record again changes nothing: no event
            self._publish(RuntimeContainerUpserted(record))

    def _create_container(self, payload: BytesLike, received: float, tn: int) -> Reply:
        req = parse_payload(api.CreateContainerRequest, payload, "CreateContainer")
        self._container_upserted(req.pod, req.container, "created")
        event = NRICreateContainer(req.pod, req.container)
        return self._serve(event, received, tn, lambda: _create_reply(req.container.id, event))

    def _start(self, phase: str, pod: api.PodSandbox, ctr: api.Container, received: float, tn: int) -> Reply:
        self._container_upserted(pod, ctr, "running" if phase == "post_start" else None)
        event = NRIStartContainer(pod, ctr, "post_start" if phase == "post_start" else "start")
        return self._serve(event, received, tn, _empty)

    def _start_rpc(self, req_cls: type[Any], phase: str) -> Handler:
        def handler(payload: BytesLike, received: float, tn: int) -> Reply:
            req = parse_payload(req_cls, payload, req_cls.__name__)
            return self._start(phase, req.pod, req.container, received, tn)

        return handler

    def _update_container(self, payload: BytesLike, received: float, tn: int) -> Reply:
        req = parse_payload(api.UpdateContainerRequest, payload, "UpdateContainer")
        if req.HasField("linux_resources"):
            # NodeState keeps the resources being asked for, not the ones the update replaces
            updated = api.Container()
            updated.CopyFrom(req.container)
            updated.linux.resources.CopyFrom(req.linux_resources)
            self._container_upserted(req.pod, updated)
        else:
            self._container_upserted(req.pod, req.container)
        event = NRIUpdateContainer(req.pod, req.container)
        event.linux_resources.CopyFrom(req.linux_resources)
        return self._serve(
            event,
            received,
            tn,
            lambda: api.UpdateContainerResponse(update=event.effective_updates()).SerializeToString(),
        )

    def _stop_container(self, payload: BytesLike, received: float, tn: int) -> Reply:
        req = parse_payload(api.StopContainerRequest, payload, "StopContainer")
        self._container_upserted(req.pod, req.container, "stopped")
        event = NRIStopContainer(req.pod, req.container)
        return self._serve(
            event,
            received,
            tn,
            lambda: api.StopContainerResponse(update=event.effective_updates()).SerializeToString(),
        )

    def _removed(self, pod: api.PodSandbox, ctr: api.Container, received: float, tn: int) -> Reply:
        return self._serve(
            NRIRemoveContainer(pod, ctr), received, tn, _empty, RuntimeContainerRemoved(ctr.id)
        )

    def _remove_container(self, payload: BytesLike, received: float, tn: int) -> Reply:
        req = parse_payload(api.RemoveContainerRequest, payload, "RemoveContainer")
        return self._removed(req.pod, req.container, received, tn)

    async def _state_change(self, payload: BytesLike, received: float, tn: int) -> bytes:
        """The pre-v0.12 (and fallback) route for the non-adjusting events."""
        req = parse_payload(api.StateChangeEvent, payload, "StateChange")
        ev = req.event
        if ev not in self._fallback_logged:
            self._fallback_logged.add(ev)
            log.debug("NRI event via StateChange", nri_event=int(ev))
        if ev == api.RUN_POD_SANDBOX:
            await self._pod_event(NRIRunPodSandbox, req.pod, received, tn)
        elif ev == api.STOP_POD_SANDBOX:
            await self._pod_event(NRIStopPodSandbox, req.pod, received, tn)
        elif ev == api.REMOVE_POD_SANDBOX:
            await self._pod_event(NRIRemovePodSandbox, req.pod, received, tn)
        elif ev == api.START_CONTAINER:
            await _reply(self._start("start", req.pod, req.container, received, tn))
        elif ev == api.POST_START_CONTAINER:
            await _reply(self._start("post_start", req.pod, req.container, received, tn))
        elif ev == api.REMOVE_CONTAINER:
            await _reply(self._removed(req.pod, req.container, received, tn))
        # other events (post-create, post-update, …) carry nothing we act on
        return b""

    def _noop(self, req_cls: type[Any]) -> Handler:
        async def handler(payload: BytesLike, received: float, tn: int) -> bytes:
            parse_payload(req_cls, payload, req_cls.__name__)
            return b""

        return handler

    async def _validate(self, payload: BytesLike, received: float, tn: int) -> bytes:
        parse_payload(api.ValidateContainerAdjustmentRequest, payload, "ValidateContainerAdjustment")
        return api.ValidateContainerAdjustmentResponse(reject=False).SerializeToString()


_REQUESTS: dict[tuple[str, str], Any] = {}  # (method, outcome) -> counter child, resolved once
_REQUEST_TIMERS: dict[str, Any] = {}  # method -> histogram child, resolved once


def _empty() -> bytes:
    return b""


async def _reply(out: Reply) -> bytes:
    return out if isinstance(out, bytes) else await out


async def _awaited_call(pending: Coroutine[Any, Any, Call]) -> None:
    try:
        await pending
    except (HookError, TimeoutException) as exc:
        raise _ErrorReply(Code.UNKNOWN, str(exc)) from None


async def _sync_reply(event: NRISynchronize) -> tuple[bytes, int]:
    """`SynchronizeResponse{update = effective updates, more = false}` and the number of updates, encoded
    one update at a time (thousands of them cost tens of ms as one message) with a yield every slice."""
    await asyncio.sleep(0)  # from a fresh step: the one that got here ran the hooks' last slice
    parts: list[bytes] = []
    clock = time.perf_counter
    until = clock() + SYNC_SLICE_SECONDS
    for i, upd in enumerate(event.updates):
        if i % 16 == 15 and clock() > until:
            await asyncio.sleep(0)
            until = clock() + SYNC_SLICE_SECONDS
        if upd.container_id and upd.linux.resources.ByteSize() > 0:  # as `effective_updates()`
            parts.append(bytes_field(1, upd.SerializeToString()))
    return b"".join(parts), len(parts)  # `more` false: proto3 leaves it out


async def _release(*lists: list[Any]) -> None:
    """Empty `lists` a few items per loop step: the messages of a 2,500-container Synchronize, freed at once
    when the handler returned, were ~6 ms of deallocation in one step."""
    clock = time.perf_counter
    for items in lists:
        await asyncio.sleep(0)  # each list from a fresh step: what ran before (the reply's encoding) and
        until = clock() + SYNC_SLICE_SECONDS  # what runs after (the reply's write) are steps of their own
        while items:
            del items[-64:]
            if clock() > until:
                await asyncio.sleep(0)
                until = clock() + SYNC_SLICE_SECONDS
    await asyncio.sleep(0)


def _create_reply(container_id: str, event: NRICreateContainer) -> bytes:
    updates = []
    for upd in event.effective_updates() if event.updates else ():  # usually none were asked for
        if upd.container_id == container_id:
            # the runtime fails the creation for this ("asked update of … during creation")
            log.warning(
                "dropping a CreateContainer update of the container being created", container=container_id
            )
            continue
        updates.append(upd)
    adjust = event.adjust.SerializeToString()
    if not updates:
        # the usual reply: `CreateContainerResponse{adjust = 1}` alone, encoded without building it
        return bytes_field(1, adjust) if adjust else b""
    resp = api.CreateContainerResponse(update=updates)
    if adjust:
        resp.adjust.CopyFrom(event.adjust)
    return resp.SerializeToString()


def _version(text: str) -> tuple[int, int]:
    """(major, minor) of an NRI module version like `v0.12.2`; (0, 0) when absent or unparsable."""
    found = re.match(r"v?(\d+)\.(\d+)", text)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _mask_from_config(text: str) -> int:
    """The event mask from the runtime-provided plugin config (YAML `{events: [...]}`)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid NRI plugin config: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        raise ConfigError("NRI plugin config must be a mapping with an `events` list")
    return parse_event_mask([str(e) for e in data["events"]])
