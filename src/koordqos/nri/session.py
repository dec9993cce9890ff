"""PluginSession: one NRI connection's plugin service: configure, synchronize and the lifecycle calls.

It serves the plugin service on conn 1 from the moment the socket is connected (Configure may arrive before
the RegisterPlugin reply), answers Configure with an explicit event mask (`nri/configure.py`), collects
chunked Synchronize requests (echoing `more`; sliced by `nri/sync.py`), and turns every lifecycle call
(dedicated RPC or the StateChange fallback) into an NRI call record (koordqos.nri.calls) that the plugin's
handler serves inside the hook core's `start_call`, with a deadline of the runtime's request timeout minus a
safety margin. Unknown methods get UNIMPLEMENTED.

Every request gives the connection one `Answer` (`nri/answer.py`), owned by the call: its reply, at once or
on a task, and what the call leaves for after the reply is written (the request's accounting, the Call to
settle, NodeState's records). NodeState's runtime view changes with every call: a sandbox is published
before its handler runs, a removal after it; a container's record (created, started, updated, stopped) is
published right after the reply is written when the call was answered at once — its hooks read pods, the
Node and the NodeSLO, never the runtime record of the container being handled, so the runtime need not wait
for that bookkeeping — and before the handler runs otherwise. Either way it happens before the next request
is read; a record equal to the one NodeState holds is not published again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import structlog

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.config import FailurePolicy
from koordqos.errors import ConfigError, HookError, ProtocolError, TimeoutException
from koordqos.events.types import (
    Event,
    NRIConnectionChanged,
    RuntimeContainerRemoved,
    RuntimeContainerUpserted,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
)
from koordqos.hooks.core import Call, call_deadline, start_call
from koordqos.nri import telemetry as m
from koordqos.nri.answer import Answer
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import (
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
from koordqos.nri.configure import configured_mask
from koordqos.nri.connection import NRIConnection
from koordqos.nri.limits import RuntimeObjectLimits
from koordqos.nri.payload import MalformedPayload, parse_payload
from koordqos.nri.runtime_objects import runtime_container, runtime_sandbox
from koordqos.nri.sync import SyncExchange, decode_chunk, release, replace_state, sync_reply
from koordqos.nri.ttrpc import BytesLike, Code, RequestEnvelope, bytes_field, encode_response
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.nri")

__all__ = [
    "DEFAULT_REGISTRATION_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "PLUGIN_SERVICE",
    "MalformedPayload",
    "NRIHandler",
    "PluginSession",
    "SessionOwner",
    "no_hooks",
    "parse_payload",
]

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


# A method handler fills in the call's Answer: `reply` the reply payload when the call was served at once,
# else `later`, a coroutine giving it; and what is to run after the reply (`Answer.then`).
Handler = Callable[[BytesLike, float, int, Answer], None]
# A method that always waits (on a task): the coroutine giving the reply payload (made a Handler by `_waits`)
Waiting = Callable[[BytesLike, float, int, Answer], Coroutine[Any, Any, bytes]]

_malformed_seen: SeenOnce[str] = SeenOnce()


def _waits(method: Waiting) -> Handler:
    def handler(payload: BytesLike, received: float, tn: int, answer: Answer) -> None:
        answer.later = method(payload, received, tn, answer)

    return handler


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
        self._sync = SyncExchange()
        self._fallback_logged: set[int] = set()
        self.methods: dict[str, Handler] = {
            "Configure": _waits(self._configure),
            "Synchronize": _waits(self._synchronize),
            "Shutdown": _waits(self._shutdown),
            "RunPodSandbox": self._pod_rpc(api.RunPodSandboxRequest, NRIRunPodSandbox),
            "StopPodSandbox": self._pod_rpc(api.StopPodSandboxRequest, NRIStopPodSandbox),
            "RemovePodSandbox": self._pod_rpc(api.RemovePodSandboxRequest, NRIRemovePodSandbox),
            "CreateContainer": self._create_container,
            "StartContainer": self._start_rpc(api.StartContainerRequest, "start"),
            "PostStartContainer": self._start_rpc(api.PostStartContainerRequest, "post_start"),
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "RemoveContainer": self._remove_container,
            "StateChange": _waits(self._state_change),
            # not subscribed; answered harmlessly should a runtime send them anyway
            "UpdatePodSandbox": self._noop(api.UpdatePodSandboxRequest),
            "PostUpdatePodSandbox": self._noop(api.PostUpdatePodSandboxRequest),
            "PostCreateContainer": self._noop(api.PostCreateContainerRequest),
            "PostUpdateContainer": self._noop(api.PostUpdateContainerRequest),
            "ValidateContainerAdjustment": _waits(self._validate),
        }

    def close(self) -> None:
        """The connection is gone: drop it and the handler table. Both refer back to the session, and a
        reference cycle is freed only by a full collection, never once the agent's GC policy froze it
        (docs/performance.md)."""
        self.conn = None
        self.methods = {}

    # -- dispatch ---------------------------------------------------------------------------------

    def handle(self, req: RequestEnvelope, received: float) -> Answer:
        """Serve one plugin-service request: its Answer, with the Response envelope, or a coroutine giving it
        when the call has to wait for something (the connection then runs it on a task). Calls whose hooks
        are synchronous (CreateContainer and the other container events) are answered right here, without
        a task or a timer; their accounting is left for after the reply."""
        answer = Answer()
        if req.service != PLUGIN_SERVICE:
            m.REQUESTS.labels("(unknown)", "unimplemented").inc()
            answer.reply = encode_response(code=Code.UNIMPLEMENTED, message=f"service {req.service}")
            return answer
        handler = self.methods.get(req.method)
        if handler is None:
            m.REQUESTS.labels("(unknown)", "unimplemented").inc()
            log.info("NRI method not implemented", method=req.method)
            answer.reply = encode_response(code=Code.UNIMPLEMENTED, message=f"method {req.method}")
            return answer
        try:
            handler(req.payload, received, req.timeout_nano, answer)
        except Exception as exc:
            answer.reply = self._failed(req, received, exc, answer)
            return answer
        later = answer.later
        if later is None:
            answer.reply = encode_response(answer.reply)
            # counted once the reply is out: nothing but the reply before it
            answer.then(self._count, req.method, "ok", time.monotonic() - received)
            return answer
        # the call waits: what it left so far (its container's record) goes out now, before it goes on; what
        # it leaves from here on runs once its reply is written
        answer.replied()
        answer.later = self._handle_later(req, received, later, answer)
        return answer

    async def _handle_later(
        self, req: RequestEnvelope, received: float, pending: Coroutine[Any, Any, bytes], answer: Answer
    ) -> bytes:
        try:
            payload = await pending
        except Exception as exc:
            return self._failed(req, received, exc, answer)
        return self._done(req, received, "ok", encode_response(payload))

    def _failed(self, req: RequestEnvelope, received: float, exc: Exception, answer: Answer) -> bytes:
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
            answer.replied()  # no reply: the connection goes, but what the call left still runs
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
        self,
        event: NRICall,
        received: float,
        timeout_nano: int,
        answer: Answer,
        policy: FailurePolicy | None = None,
    ) -> Coroutine[Any, Any, None] | None:
        """Serve `event` within the deadline: None when the handler completed here (its Call is settled once
        the reply is written), else a coroutine that completes it; under Fail a failure becomes an error
        reply (_ErrorReply)."""
        deadline = call_deadline(self.request_timeout, time.monotonic() - received, timeout_nano)
        state = self.bus.state
        handler = self.plugin.handler
        try:
            call = start_call(
                type(event).__name__,
                deadline,
                policy or self.plugin.failure_policy,
                lambda call: handler(event, state, call),
                settle=False,
            )
        except (HookError, TimeoutException) as exc:
            # a plain error status, as a Go handler returning an error: the runtime fails the operation
            raise _ErrorReply(Code.UNKNOWN, str(exc)) from None
        rest = call.rest
        if rest is None:
            answer.then(call.settle)
            return None
        return _awaited(rest)

    async def _request(
        self,
        event: NRICall,
        received: float,
        timeout_nano: int,
        answer: Answer,
        policy: FailurePolicy | None = None,
    ) -> None:
        """`_request_now` for the handlers that run on a task anyway."""
        pending = self._request_now(event, received, timeout_nano, answer, policy)
        if pending is not None:
            await pending

    def _serve(
        self,
        event: NRICall,
        received: float,
        tn: int,
        answer: Answer,
        reply: Callable[[], bytes],
        after: Event | None = None,
    ) -> None:
        """Serve `event` into `answer`; the reply payload is `reply()` once the handler completed (here, or
        later on a task); `after` is published then (removals leave NodeState after the hooks ran)."""
        pending = self._request_now(event, received, tn, answer)
        if pending is None:
            if after is not None:
                answer.then(self._publish, after)
            answer.reply = reply()
            return
        answer.later = self._reply_later(pending, reply, after)

    async def _reply_later(
        self, pending: Coroutine[Any, Any, None], reply: Callable[[], bytes], after: Event | None
    ) -> bytes:
        await pending
        if after is not None:
            self._publish(after)
        return reply()

    # -- configure / synchronize ------------------------------------------------------------------

    async def _configure(
        self, payload: BytesLike, received: float, timeout_nano: int, answer: Answer
    ) -> bytes:
        req = parse_payload(api.ConfigureRequest, payload, "Configure")
        self.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
        self.nri_version = req.NRI_version
        if req.request_timeout > 0:
            self.request_timeout = req.request_timeout / 1000
        if req.registration_timeout > 0:
            self.registration_timeout = req.registration_timeout / 1000
        try:
            mask = configured_mask(self.plugin.events_mask, req.config, req.NRI_version)
        except ConfigError as exc:
            raise _ErrorReply(Code.INVALID_ARGUMENT, str(exc)) from None
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

    async def _synchronize(
        self, payload: BytesLike, received: float, timeout_nano: int, answer: Answer
    ) -> bytes:
        chunk = await decode_chunk(payload)
        self._sync.add(chunk, received, self.plugin.limits)
        more = chunk.more
        del chunk  # its lists hold the messages too; they are freed in slices below (`release`)
        if more:
            return api.SynchronizeResponse(more=True).SerializeToString()
        pods, containers, started = self._sync.take()
        counts = len(pods), len(containers)  # the lists are emptied by `release` below
        await replace_state(pods, containers, self._publish)
        event = NRISynchronize(pods=pods, containers=containers, reconnect=self.plugin.syncs > 0)
        # The runtime's timeout_nano already has the time spent on earlier chunks taken off: measured from
        # this chunk then. Without it the first chunk's arrival starts the clock.
        since = received if timeout_nano > 0 or started is None else started
        # Always Ignore here: an error reply to Synchronize makes the runtime close the connection, and the
        # same error on every reconnect would keep NRI down for good (koordlet answers Synchronize with no
        # error in every case). What the hooks computed is sent; the reconciler covers the rest.
        await self._request(event, since, timeout_nano, answer, policy="Ignore")
        reply, updates = await sync_reply(event)
        event.drop_index()  # first: the index holds the updates too, which would then all go at once
        await release(event.updates, containers, pods)
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

    async def _shutdown(
        self, payload: BytesLike, received: float, timeout_nano: int, answer: Answer
    ) -> bytes:
        log.info("NRI runtime announced shutdown")
        return b""

    # -- lifecycle events -------------------------------------------------------------------------

    async def _pod_event(
        self, cls: type[NRIPodEvent], pod: api.PodSandbox, received: float, tn: int, answer: Answer
    ) -> None:
        if cls is not NRIRemovePodSandbox and self.plugin.limits.admit(
            "sandbox", self.bus.state.sandboxes, pod.id
        ):
            self._publish(RuntimeSandboxUpserted(runtime_sandbox(pod)))
        await self._request(cls(pod), received, tn, answer)
        if cls is NRIRemovePodSandbox:
            self._publish(RuntimeSandboxRemoved(pod.id))

    def _pod_rpc(self, req_cls: type[Any], cls: type[NRIPodEvent]) -> Handler:
        async def method(payload: BytesLike, received: float, tn: int, answer: Answer) -> bytes:
            req = parse_payload(req_cls, payload, req_cls.__name__)
            await self._pod_event(cls, req.pod, received, tn, answer)
            return b""

        return _waits(method)

    def _container_upserted(
        self, answer: Answer, pod: api.PodSandbox, ctr: api.Container, state: str | None = None
    ) -> None:
        answer.then(self._publish_container, pod, ctr, state)

    def _publish_container(self, pod: api.PodSandbox, ctr: api.Container, state: str | None) -> None:
        node = self.bus.state
        if not self.plugin.limits.admit("container", node.containers, ctr.id):
            return
        uid = pod.uid or getattr(node.sandboxes.get(ctr.pod_sandbox_id), "uid", "")
        record = runtime_container(ctr, uid, state)
        if node.containers.get(ctr.id) != record:  # the same record again changes nothing: no event
            self._publish(RuntimeContainerUpserted(record))

    def _create_container(self, payload: BytesLike, received: float, tn: int, answer: Answer) -> None:
        req = parse_payload(api.CreateContainerRequest, payload, "CreateContainer")
        self._container_upserted(answer, req.pod, req.container, "created")
        event = NRICreateContainer(req.pod, req.container)
        self._serve(event, received, tn, answer, lambda: _create_reply(req.container.id, event))

    def _start(
        self, phase: str, pod: api.PodSandbox, ctr: api.Container, received: float, tn: int, answer: Answer
    ) -> None:
        self._container_upserted(answer, pod, ctr, "running" if phase == "post_start" else None)
        event = NRIStartContainer(pod, ctr, "post_start" if phase == "post_start" else "start")
        self._serve(event, received, tn, answer, _empty)

    def _start_rpc(self, req_cls: type[Any], phase: str) -> Handler:
        def handler(payload: BytesLike, received: float, tn: int, answer: Answer) -> None:
            req = parse_payload(req_cls, payload, req_cls.__name__)
            self._start(phase, req.pod, req.container, received, tn, answer)

        return handler

    def _update_container(self, payload: BytesLike, received: float, tn: int, answer: Answer) -> None:
        req = parse_payload(api.UpdateContainerRequest, payload, "UpdateContainer")
        if req.HasField("linux_resources"):
            # NodeState keeps the resources being asked for, not the ones the update replaces
            updated = api.Container()
            updated.CopyFrom(req.container)
            updated.linux.resources.CopyFrom(req.linux_resources)
            self._container_upserted(answer, req.pod, updated)
        else:
            self._container_upserted(answer, req.pod, req.container)
        event = NRIUpdateContainer(req.pod, req.container)
        event.linux_resources.CopyFrom(req.linux_resources)
        self._serve(
            event,
            received,
            tn,
            answer,
            lambda: api.UpdateContainerResponse(update=event.effective_updates()).SerializeToString(),
        )

    def _stop_container(self, payload: BytesLike, received: float, tn: int, answer: Answer) -> None:
        req = parse_payload(api.StopContainerRequest, payload, "StopContainer")
        self._container_upserted(answer, req.pod, req.container, "stopped")
        event = NRIStopContainer(req.pod, req.container)
        self._serve(
            event,
            received,
            tn,
            answer,
            lambda: api.StopContainerResponse(update=event.effective_updates()).SerializeToString(),
        )

    def _removed(
        self, pod: api.PodSandbox, ctr: api.Container, received: float, tn: int, answer: Answer
    ) -> None:
        self._serve(
            NRIRemoveContainer(pod, ctr), received, tn, answer, _empty, RuntimeContainerRemoved(ctr.id)
        )

    def _remove_container(self, payload: BytesLike, received: float, tn: int, answer: Answer) -> None:
        req = parse_payload(api.RemoveContainerRequest, payload, "RemoveContainer")
        self._removed(req.pod, req.container, received, tn, answer)

    async def _state_change(self, payload: BytesLike, received: float, tn: int, answer: Answer) -> bytes:
        """The pre-v0.12 (and fallback) route for the non-adjusting events."""
        req = parse_payload(api.StateChangeEvent, payload, "StateChange")
        ev = req.event
        if ev not in self._fallback_logged:
            self._fallback_logged.add(ev)
            log.debug("NRI event via StateChange", nri_event=int(ev))
        # a container event is served as its own call, whose reply is dropped (StateChange's is empty) and
        # whose after-reply work is the StateChange's
        inner = Answer(after=answer.after)
        if ev == api.RUN_POD_SANDBOX:
            await self._pod_event(NRIRunPodSandbox, req.pod, received, tn, answer)
        elif ev == api.STOP_POD_SANDBOX:
            await self._pod_event(NRIStopPodSandbox, req.pod, received, tn, answer)
        elif ev == api.REMOVE_POD_SANDBOX:
            await self._pod_event(NRIRemovePodSandbox, req.pod, received, tn, answer)
        elif ev == api.START_CONTAINER:
            self._start("start", req.pod, req.container, received, tn, inner)
        elif ev == api.POST_START_CONTAINER:
            self._start("post_start", req.pod, req.container, received, tn, inner)
        elif ev == api.REMOVE_CONTAINER:
            self._removed(req.pod, req.container, received, tn, inner)
        # other events (post-create, post-update, …) carry nothing we act on
        if inner.later is not None:
            await inner.later
        return b""

    def _noop(self, req_cls: type[Any]) -> Handler:
        async def method(payload: BytesLike, received: float, tn: int, answer: Answer) -> bytes:
            parse_payload(req_cls, payload, req_cls.__name__)
            return b""

        return _waits(method)

    async def _validate(self, payload: BytesLike, received: float, tn: int, answer: Answer) -> bytes:
        parse_payload(api.ValidateContainerAdjustmentRequest, payload, "ValidateContainerAdjustment")
        return api.ValidateContainerAdjustmentResponse(reject=False).SerializeToString()


_REQUESTS: dict[tuple[str, str], Any] = {}  # (method, outcome) -> counter child, resolved once
_REQUEST_TIMERS: dict[str, Any] = {}  # method -> histogram child, resolved once


def _empty() -> bytes:
    return b""


async def _awaited(rest: Coroutine[Any, Any, None]) -> None:
    try:
        await rest
    except (HookError, TimeoutException) as exc:
        raise _ErrorReply(Code.UNKNOWN, str(exc)) from None


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
