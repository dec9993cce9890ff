"""PluginSession: one NRI connection's plugin service: configure, synchronize and the lifecycle calls.

It serves the plugin service on conn 1 from the moment the socket is connected (Configure may arrive before
the RegisterPlugin reply), answers Configure with an explicit event mask, collects chunked Synchronize
requests (echoing `more`), and turns every lifecycle call (dedicated RPC or the StateChange fallback) into an
NRI call record (koordqos.nri.events) that the plugin's handler serves inside the hook core's `run_call`, with
a deadline of the runtime's request timeout minus a safety margin. Unknown methods get UNIMPLEMENTED.
NodeState's runtime view is published before the handler runs (removals after it).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import structlog
import yaml
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from koordqos import observability as obs
from koordqos.config import FailurePolicy
from koordqos.errors import ConfigError, HookError, ProtocolError, TimeoutException
from koordqos.events.bus import EventBus
from koordqos.events.types import (
    Event,
    NRIConnectionChanged,
    RuntimeContainerRemoved,
    RuntimeContainerUpserted,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
)
from koordqos.hooks.core import Call, call_deadline, run_call
from koordqos.nri import metrics as m
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.api import ttrpc_pb2
from koordqos.nri.connection import NRIConnection
from koordqos.nri.events import (
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
    runtime_container,
    runtime_sandbox,
)
from koordqos.nri.limits import RuntimeObjectLimits
from koordqos.nri.mask import VALID_EVENTS_LEGACY, parse_event_mask, validate_event_mask
from koordqos.nri.ttrpc import Code, encode_response
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
Handler = Callable[[bytes, float, int], Awaitable[bytes]]


class MalformedPayload(ProtocolError):
    """A message in an intact frame that does not parse: that request is answered with an error status, the
    connection is kept (only a broken byte stream drops it)."""


def parse_payload(cls: type[P], payload: bytes, method: str) -> P:
    """Decode a message of `cls`; MalformedPayload when it does not parse (whatever the parser raises)."""
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, ValueError) as exc:
        raise MalformedPayload(f"{method}: payload does not parse as {cls.__name__}: {exc}") from None
    except Exception as exc:  # e.g. RecursionError from nesting: still just this message
        raise MalformedPayload(
            f"{method}: payload does not parse as {cls.__name__}: {type(exc).__name__}"
        ) from None
    return msg


_malformed_seen: SeenOnce[str] = SeenOnce()


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

    # -- dispatch ---------------------------------------------------------------------------------

    async def handle(self, req: ttrpc_pb2.Request, received: float) -> bytes:
        """Serve one plugin-service request; returns the Response envelope."""
        if req.service != PLUGIN_SERVICE:
            m.REQUESTS.labels("(unknown)", "unimplemented").inc()
            return encode_response(code=Code.UNIMPLEMENTED, message=f"service {req.service}")
        handler = self.methods.get(req.method)
        if handler is None:
            m.REQUESTS.labels("(unknown)", "unimplemented").inc()
            log.info("NRI method not implemented", method=req.method)
            return encode_response(code=Code.UNIMPLEMENTED, message=f"method {req.method}")
        outcome = "ok"
        try:
            reply = encode_response(await handler(req.payload, received, req.timeout_nano))
        except _ErrorReply as err:
            outcome = "error"
            reply = encode_response(code=err.code, message=err.message)
        except MalformedPayload as exc:
            # framing intact: answer this request (as ttrpc servers answer an undecodable request) and go on
            outcome = "malformed"
            m.MALFORMED_REQUESTS.labels("plugin", req.method).inc()
            if _malformed_seen.first(req.method):
                log.warning(
                    "malformed NRI request answered INVALID_ARGUMENT", method=req.method, error=str(exc)
                )
            reply = encode_response(code=Code.INVALID_ARGUMENT, message=str(exc))
        except ProtocolError:
            outcome = "protocol_error"
            raise
        except Exception as exc:
            # a bug of ours must not fail the pod (Ignore) nor, on Configure, subscribe us to everything
            outcome = "internal_error"
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
        finally:
            took = time.monotonic() - received
            m.REQUESTS.labels(req.method, outcome).inc()
            m.REQUEST_SECONDS.labels(req.method).observe(took)
            if self.plugin.timings is not None:
                self.plugin.timings.setdefault(req.method, []).append(took)
        return reply

    def _publish(self, event: Event) -> None:
        # never wait for a full subscriber queue on the reply path: the runtime's clock is running
        self.bus.publish_nowait(event)

    async def _request(
        self, event: NRICall, received: float, timeout_nano: int, policy: FailurePolicy | None = None
    ) -> None:
        """Serve `event` within the deadline; under Fail a failure becomes an error reply."""
        deadline = call_deadline(self.request_timeout, time.monotonic() - received, timeout_nano)
        state = self.bus.state
        handler = self.plugin.handler
        try:
            await run_call(
                type(event).__name__,
                deadline,
                policy or self.plugin.failure_policy,
                lambda call: handler(event, state, call),
            )
        except (HookError, TimeoutException) as exc:
            # a plain error status, as a Go handler returning an error: the runtime fails the operation
            raise _ErrorReply(Code.UNKNOWN, str(exc)) from None

    # -- configure / synchronize ------------------------------------------------------------------

    async def _configure(self, payload: bytes, received: float, timeout_nano: int) -> bytes:
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

    async def _synchronize(self, payload: bytes, received: float, timeout_nano: int) -> bytes:
        req = parse_payload(api.SynchronizeRequest, payload, "Synchronize")
        if self._sync_started is None:
            self._sync_started = received  # one request timeout covers the whole chunked exchange
        limits = self.plugin.limits  # a runtime could send `more` chunks forever
        self._sync_pods.extend(limits.cap("sandbox", self._sync_pods, list(req.pods)))
        self._sync_containers.extend(limits.cap("container", self._sync_containers, list(req.containers)))
        if req.more:
            return api.SynchronizeResponse(more=True).SerializeToString()
        started = self._sync_started
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers, self._sync_started = [], [], None
        self._replace_state(pods, containers)
        event = NRISynchronize(pods=pods, containers=containers, reconnect=self.plugin.syncs > 0)
        # The runtime's timeout_nano already has the time spent on earlier chunks taken off: measured from
        # this chunk then. Without it the first chunk's arrival starts the clock.
        since = received if timeout_nano > 0 else started
        # Always Ignore here: an error reply to Synchronize makes the runtime close the connection, and the
        # same error on every reconnect would keep NRI down for good (koordlet answers Synchronize with no
        # error in every case). What the hooks computed is sent; the reconciler covers the rest.
        await self._request(event, since, timeout_nano, policy="Ignore")
        updates = event.effective_updates()
        self.plugin.syncs += 1
        self.synced.set()
        self.plugin.set_status("connected")
        log.info(
            "NRI synchronized",
            pods=len(pods),
            containers=len(containers),
            updates=len(updates),
            reconnect=event.reconnect,
        )
        return api.SynchronizeResponse(update=updates, more=False).SerializeToString()

    def _replace_state(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        """Make NodeState's runtime view exactly the synchronized one (stale entries from before go)."""
        uid_of = {p.id: p.uid for p in pods}
        self._publish(
            RuntimeSynchronized(
                tuple(runtime_sandbox(pod) for pod in pods),
                tuple(runtime_container(ctr, uid_of.get(ctr.pod_sandbox_id, "")) for ctr in containers),
            )
        )

    async def _shutdown(self, payload: bytes, received: float, timeout_nano: int) -> bytes:
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
        async def handler(payload: bytes, received: float, tn: int) -> bytes:
            req = parse_payload(req_cls, payload, req_cls.__name__)
            await self._pod_event(cls, req.pod, received, tn)
            return b""

        return handler

    def _container_upserted(self, pod: api.PodSandbox, ctr: api.Container, state: str | None = None) -> None:
        node = self.bus.state
        if not self.plugin.limits.admit("container", node.containers, ctr.id):
            return
        uid = pod.uid or getattr(node.sandboxes.get(ctr.pod_sandbox_id), "uid", "")
        self._publish(RuntimeContainerUpserted(runtime_container(ctr, uid, state)))

    async def _create_container(self, payload: bytes, received: float, tn: int) -> bytes:
        req = parse_payload(api.CreateContainerRequest, payload, "CreateContainer")
        self._container_upserted(req.pod, req.container, "created")
        event = NRICreateContainer(req.pod, req.container)
        await self._request(event, received, tn)
        updates = []
        for upd in event.effective_updates():
            if upd.container_id == req.container.id:
                # the runtime fails the creation for this ("asked update of … during creation")
                log.warning(
                    "dropping a CreateContainer update of the container being created",
                    container=req.container.id,
                )
                continue
            updates.append(upd)
        resp = api.CreateContainerResponse(update=updates)
        if event.adjust.ByteSize():
            resp.adjust.CopyFrom(event.adjust)
        return resp.SerializeToString()

    async def _start(
        self, phase: str, pod: api.PodSandbox, ctr: api.Container, received: float, tn: int
    ) -> None:
        self._container_upserted(pod, ctr, "running" if phase == "post_start" else None)
        await self._request(
            NRIStartContainer(pod, ctr, "post_start" if phase == "post_start" else "start"), received, tn
        )

    def _start_rpc(self, req_cls: type[Any], phase: str) -> Handler:
        async def handler(payload: bytes, received: float, tn: int) -> bytes:
            req = parse_payload(req_cls, payload, req_cls.__name__)
            await self._start(phase, req.pod, req.container, received, tn)
            return b""

        return handler

    async def _update_container(self, payload: bytes, received: float, tn: int) -> bytes:
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
        await self._request(event, received, tn)
        return api.UpdateContainerResponse(update=event.effective_updates()).SerializeToString()

    async def _stop_container(self, payload: bytes, received: float, tn: int) -> bytes:
        req = parse_payload(api.StopContainerRequest, payload, "StopContainer")
        self._container_upserted(req.pod, req.container, "stopped")
        event = NRIStopContainer(req.pod, req.container)
        await self._request(event, received, tn)
        return api.StopContainerResponse(update=event.effective_updates()).SerializeToString()

    async def _removed(self, pod: api.PodSandbox, ctr: api.Container, received: float, tn: int) -> None:
        await self._request(NRIRemoveContainer(pod, ctr), received, tn)
        self._publish(RuntimeContainerRemoved(ctr.id))

    async def _remove_container(self, payload: bytes, received: float, tn: int) -> bytes:
        req = parse_payload(api.RemoveContainerRequest, payload, "RemoveContainer")
        await self._removed(req.pod, req.container, received, tn)
        return b""

    async def _state_change(self, payload: bytes, received: float, tn: int) -> bytes:
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
            await self._start("start", req.pod, req.container, received, tn)
        elif ev == api.POST_START_CONTAINER:
            await self._start("post_start", req.pod, req.container, received, tn)
        elif ev == api.REMOVE_CONTAINER:
            await self._removed(req.pod, req.container, received, tn)
        # other events (post-create, post-update, …) carry nothing we act on
        return b""

    def _noop(self, req_cls: type[Any]) -> Handler:
        async def handler(payload: bytes, received: float, tn: int) -> bytes:
            parse_payload(req_cls, payload, req_cls.__name__)
            return b""

        return handler

    async def _validate(self, payload: bytes, received: float, tn: int) -> bytes:
        parse_payload(api.ValidateContainerAdjustmentRequest, payload, "ValidateContainerAdjustment")
        return api.ValidateContainerAdjustmentResponse(reject=False).SerializeToString()


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
