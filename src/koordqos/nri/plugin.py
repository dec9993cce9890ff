"""NRIPlugin: registers with the container runtime over NRI, serves its calls, reconnects when it goes.

One `PluginSession` per connection: it serves the plugin service on conn 1 from the moment the socket is
connected (Configure may arrive before the RegisterPlugin reply), registers, answers Configure with an
explicit event mask, collects chunked Synchronize requests (echoing `more`), and turns every lifecycle call
(dedicated RPC or the StateChange fallback) into a bus request (koordqos.nri.events) with a deadline of the
runtime's request timeout minus a safety margin. Unknown methods get UNIMPLEMENTED. `NRIPlugin` runs
sessions in a loop with capped exponential backoff and jitter (the runtime never reconnects by itself);
every new session re-registers and is re-synchronized, which re-applies the hooks to every container.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog
import yaml
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from koordqos import observability as obs
from koordqos.config import FailurePolicy, NRISettings
from koordqos.errors import ConfigError, HookError, KoordQoSError, ProtocolError, TimeoutException
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
from koordqos.nri import metrics as m
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.api import ttrpc_pb2
from koordqos.nri.connection import ConnectionClosedError, NRIConnection
from koordqos.nri.events import (
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
from koordqos.nri.ttrpc import Code, encode_response

log = structlog.get_logger("koordqos.nri")

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
NRI_VERSION = "v0.12.2"  # the protocol version our proto describes (only logged by the runtime)

DEFAULT_REQUEST_TIMEOUT = 2.0  # seconds, when Configure does not say (runtimes before NRI v0.7)
DEFAULT_REGISTRATION_TIMEOUT = 5.0
VALID_EVENTS_LEGACY = 0x07FF  # NRI v0.3-v0.9 (a runtime that sends no NRI_version may be one of these)
VALID_EVENTS = 0x3FFF  # NRI v0.10+


def event_bit(event: int) -> int:
    """The subscription-mask bit of an NRI Event enum value."""
    return 1 << (event - 1)


DEFAULT_EVENTS = (
    event_bit(api.RUN_POD_SANDBOX)
    | event_bit(api.STOP_POD_SANDBOX)
    | event_bit(api.REMOVE_POD_SANDBOX)
    | event_bit(api.CREATE_CONTAINER)
    | event_bit(api.POST_START_CONTAINER)
    | event_bit(api.UPDATE_CONTAINER)
    | event_bit(api.STOP_CONTAINER)
    | event_bit(api.REMOVE_CONTAINER)
)
# Events we never subscribe to: being a validator makes every creation depend on us, and UpdatePodSandbox
# has no StateChange fallback on older runtimes.
_FORBIDDEN_EVENTS = event_bit(api.VALIDATE_CONTAINER_ADJUSTMENT) | event_bit(api.UPDATE_POD_SANDBOX)


# The NRI events that carry each runtime-hook stage: `--runtime-hooks-disable-stages` takes them out of the
# subscription, so a disabled stage costs the runtime no round trip (project decision, runtime-hooks §4).
STAGE_EVENTS: dict[str, int] = {
    "PreRunPodSandbox": event_bit(api.RUN_POD_SANDBOX),
    "PreCreateContainer": event_bit(api.CREATE_CONTAINER),
    "PreUpdateContainerResources": event_bit(api.UPDATE_CONTAINER),
    "PreRemoveRunPodSandbox": event_bit(api.REMOVE_POD_SANDBOX),
}


def mask_without_stages(mask: int, disabled: Sequence[str]) -> int:
    """`mask` less the events of the disabled stages (stages with no NRI event change nothing)."""
    for stage in disabled:
        mask &= ~STAGE_EVENTS.get(stage, 0)
    return mask


def _norm(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


_EVENT_BY_NAME = {_norm(n): v for n, v in api.Event.items() if v not in (api.UNKNOWN, api.LAST)}


def parse_event_mask(names: Sequence[str]) -> int:
    """Mask from event names (`RunPodSandbox`, `run_pod_sandbox`, …); ConfigError on an unknown name."""
    mask = 0
    for name in names:
        ev = _EVENT_BY_NAME.get(_norm(str(name)))
        if ev is None:
            raise ConfigError(f"unknown NRI event {name!r}")
        mask |= event_bit(ev)
    return mask


def validate_event_mask(mask: int) -> int:
    """`mask` if a runtime accepts it from us (non-zero, known events, not a validator); else ConfigError."""
    if mask == 0:
        raise ConfigError(
            "NRI event mask must not be empty (0 subscribes to everything, validation included)"
        )
    if mask & ~VALID_EVENTS:
        raise ConfigError(f"NRI event mask {mask:#x} has bits outside {VALID_EVENTS:#x}")
    if mask & _FORBIDDEN_EVENTS:
        raise ConfigError(f"NRI event mask {mask:#x} must not include UpdatePodSandbox or validation")
    return mask


def hook_deadline(request_timeout: float, elapsed: float, timeout_nano: int = 0) -> float:
    """Seconds the hooks may run: the runtime's timeout minus a safety margin (20 %, at least 100 ms,
    at most 500 ms) and minus the time already spent; never below 1 ms."""
    budget = request_timeout
    if timeout_nano > 0:
        budget = min(budget, timeout_nano / 1e9)
    margin = min(0.5, max(0.1, 0.2 * budget))
    return max(0.001, budget - margin - elapsed)


class NRINotConnectedError(KoordQoSError):
    """An unsolicited call was attempted while the plugin is not registered with a runtime."""


class _ErrorReply(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


P = TypeVar("P", bound=ProtoMessage)
Handler = Callable[[bytes, float, int], Awaitable[bytes]]


def _parse(cls: type[P], payload: bytes, method: str) -> P:
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, ValueError) as exc:
        raise ProtocolError(f"{method}: request payload does not parse as {cls.__name__}: {exc}") from None
    return msg


class PluginSession:
    """One connection's worth of plugin state and the plugin-service handlers."""

    def __init__(self, plugin: NRIPlugin) -> None:
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
        self, event: Any, received: float, timeout_nano: int, policy: FailurePolicy | None = None
    ) -> None:
        """Run the hooks for `event` within the deadline; under Fail a failure becomes an error reply."""
        deadline = hook_deadline(self.request_timeout, time.monotonic() - received, timeout_nano)
        try:
            await self.bus.request(event, deadline, policy or self.plugin.failure_policy)
        except (HookError, TimeoutException) as exc:
            # a plain error status, as a Go handler returning an error: the runtime fails the operation
            raise _ErrorReply(Code.UNKNOWN, str(exc)) from None

    # -- configure / synchronize ------------------------------------------------------------------

    async def _configure(self, payload: bytes, received: float, timeout_nano: int) -> bytes:
        req = _parse(api.ConfigureRequest, payload, "Configure")
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
        self.plugin._set_status("synchronizing")
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
        req = _parse(api.SynchronizeRequest, payload, "Synchronize")
        if self._sync_started is None:
            self._sync_started = received  # one request timeout covers the whole chunked exchange
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
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
        self.plugin._set_status("connected")
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
        if cls is not NRIRemovePodSandbox:
            self._publish(RuntimeSandboxUpserted(runtime_sandbox(pod)))
        await self._request(cls(pod), received, tn)
        if cls is NRIRemovePodSandbox:
            self._publish(RuntimeSandboxRemoved(pod.id))

    def _pod_rpc(self, req_cls: type[Any], cls: type[NRIPodEvent]) -> Handler:
        async def handler(payload: bytes, received: float, tn: int) -> bytes:
            req = _parse(req_cls, payload, req_cls.__name__)
            await self._pod_event(cls, req.pod, received, tn)
            return b""

        return handler

    def _container_upserted(self, pod: api.PodSandbox, ctr: api.Container, state: str | None = None) -> None:
        uid = pod.uid or getattr(self.bus.state.sandboxes.get(ctr.pod_sandbox_id), "uid", "")
        self._publish(RuntimeContainerUpserted(runtime_container(ctr, uid, state)))

    async def _create_container(self, payload: bytes, received: float, tn: int) -> bytes:
        req = _parse(api.CreateContainerRequest, payload, "CreateContainer")
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
            req = _parse(req_cls, payload, req_cls.__name__)
            await self._start(phase, req.pod, req.container, received, tn)
            return b""

        return handler

    async def _update_container(self, payload: bytes, received: float, tn: int) -> bytes:
        req = _parse(api.UpdateContainerRequest, payload, "UpdateContainer")
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
        req = _parse(api.StopContainerRequest, payload, "StopContainer")
        self._container_upserted(req.pod, req.container, "stopped")
        event = NRIStopContainer(req.pod, req.container)
        await self._request(event, received, tn)
        return api.StopContainerResponse(update=event.effective_updates()).SerializeToString()

    async def _removed(self, pod: api.PodSandbox, ctr: api.Container, received: float, tn: int) -> None:
        await self._request(NRIRemoveContainer(pod, ctr), received, tn)
        self._publish(RuntimeContainerRemoved(ctr.id))

    async def _remove_container(self, payload: bytes, received: float, tn: int) -> bytes:
        req = _parse(api.RemoveContainerRequest, payload, "RemoveContainer")
        await self._removed(req.pod, req.container, received, tn)
        return b""

    async def _state_change(self, payload: bytes, received: float, tn: int) -> bytes:
        """The pre-v0.12 (and fallback) route for the non-adjusting events."""
        req = _parse(api.StateChangeEvent, payload, "StateChange")
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
            _parse(req_cls, payload, req_cls.__name__)
            return b""

        return handler

    async def _validate(self, payload: bytes, received: float, tn: int) -> bytes:
        _parse(api.ValidateContainerAdjustmentRequest, payload, "ValidateContainerAdjustment")
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


class NRIPlugin:
    """The NRI plugin component: connect, register, serve, and reconnect with backoff until cancelled."""

    name = "nri"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        settings: NRISettings,
        *,
        failure_policy: FailurePolicy = "Ignore",
        events_mask: int = DEFAULT_EVENTS,
        status: MutableMapping[str, Any] | None = None,
        socket_fd: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.failure_policy: FailurePolicy = failure_policy
        self.events_mask = validate_event_mask(events_mask)
        self.status = status if status is not None else {}
        self.socket_fd = socket_fd
        self._rng = rng or random.Random()
        self.session: PluginSession | None = None
        self.syncs = 0  # completed Synchronize exchanges over the life of the plugin
        self.sessions = 0
        self.timings: dict[str, list[float]] | None = None  # plugin-side seconds per method, when enabled
        self._set_status("connecting")

    @classmethod
    def from_env(
        cls, bus: EventBus, settings: NRISettings, env: MutableMapping[str, str] | None = None, **kwargs: Any
    ) -> NRIPlugin:
        """Honour NRI_PLUGIN_SOCKET (fd), NRI_PLUGIN_NAME and NRI_PLUGIN_IDX when the runtime launched us."""
        env = os.environ if env is None else env
        fd: int | None = None
        raw = env.get("NRI_PLUGIN_SOCKET", "")
        if raw:
            if not raw.isdigit():
                raise ConfigError(f"NRI_PLUGIN_SOCKET must be a file descriptor number, got {raw!r}")
            fd = int(raw)
            update: dict[str, Any] = {}
            if env.get("NRI_PLUGIN_NAME"):
                update["plugin_name"] = env["NRI_PLUGIN_NAME"]
            if env.get("NRI_PLUGIN_IDX"):
                update["plugin_index"] = env["NRI_PLUGIN_IDX"]
            if update:
                settings = NRISettings.model_validate({**settings.model_dump(), **update})
        return cls(bus, settings, socket_fd=fd, **kwargs)

    # -- public -----------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Registered, configured and synchronized with a runtime right now."""
        s = self.session
        return s is not None and s.synced.is_set() and s.conn is not None and s.conn.is_open

    async def wait_connected(self, timeout: float) -> None:
        """Wait until a session has synchronized (TimeoutError after `timeout`)."""
        async with asyncio.timeout(timeout):
            while not self.connected:
                await asyncio.sleep(0.005)

    async def update_containers(
        self, updates: Sequence[api.ContainerUpdate], timeout: float | None = None
    ) -> list[api.ContainerUpdate]:
        """Send unsolicited UpdateContainers; returns the updates the runtime failed to apply."""
        s = self.session
        if s is None or not s.registered or s.conn is None or not s.conn.is_open:
            raise NRINotConnectedError("NRI plugin is not registered with a runtime")
        req = api.UpdateContainersRequest(update=list(updates))
        try:
            resp = await s.conn.call(
                RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), timeout or s.request_timeout
            )
        except ConnectionClosedError as exc:
            raise NRINotConnectedError(str(exc)) from None
        if resp.status.code:
            raise KoordQoSError(f"UpdateContainers failed: {resp.status.message} (code {resp.status.code})")
        out = _parse(api.UpdateContainersResponse, resp.payload, "UpdateContainersResponse")
        return list(out.failed)

    # -- component --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep a session with the runtime alive until cancelled."""
        failures = 0
        try:
            while True:
                if self.sessions:
                    m.RECONNECTS.inc()
                self.sessions += 1
                healthy = await self._session(failures)
                failures = 0 if healthy else failures + 1
                if self.socket_fd is not None:
                    # Launched by the runtime over a socketpair, which it closed (after a slow reply, say):
                    # it never relaunches a plugin it dropped, so dial its socket like an external plugin.
                    self.socket_fd = None
                    log.warning(
                        "NRI runtime closed the pre-connected socket; connecting to its socket instead",
                        socket=str(self.settings.socket),
                    )
                delay = self.backoff(failures + 1)
                self._set_status("backoff")
                log.debug("NRI reconnecting", retry_in_s=round(delay, 3), failures=failures)
                await asyncio.sleep(delay)
        finally:
            self._set_status("stopped")

    def backoff(self, attempt: int) -> float:
        """Delay before attempt `attempt` (1-based): base·2^(n-1) capped, with ±10 % jitter."""
        s = self.settings
        delay = min(s.backoff_cap_seconds, s.backoff_seconds * 2 ** min(attempt - 1, 32))
        return float(delay * (1 + self._rng.uniform(-0.1, 0.1)))

    def _set_status(self, value: str) -> None:
        self.status["nri"] = value

    async def _open(self, session: PluginSession) -> NRIConnection:
        loop = asyncio.get_running_loop()

        def factory() -> NRIConnection:
            return NRIConnection(session.handle, role="plugin")

        async with asyncio.timeout(self.settings.connect_timeout_seconds):
            if self.socket_fd is not None:
                sock = socket.socket(fileno=self.socket_fd)
                self.socket_fd = sock.fileno()
                _, proto = await loop.create_unix_connection(factory, sock=sock)
            else:
                _, proto = await loop.create_unix_connection(factory, str(Path(self.settings.socket)))
        return proto

    async def _session(self, failures: int) -> bool:
        """One connection from connect to close; True if it got as far as a completed Synchronize."""
        session = PluginSession(self)
        self._set_status("connecting")
        try:
            conn = await self._open(session)
        except (OSError, TimeoutError) as exc:
            m.CONNECT_FAILURES.labels("connect").inc()
            # first failure of a streak at warning, the rest (the runtime is down) at debug
            (log.warning if failures == 0 else log.debug)(
                "NRI runtime socket unavailable",
                socket=str(self.settings.socket),
                error=f"{type(exc).__name__}: {exc}",
                failures=failures + 1,
            )
            return False
        session.conn = conn
        self.session = session
        try:
            self._set_status("registering")
            if not await self._register(session, conn):
                return False
            # Configure (possibly already done) and the whole Synchronize must follow promptly
            wait = self.settings.connect_timeout_seconds + session.registration_timeout
            synced: asyncio.Future[Any] = asyncio.ensure_future(session.synced.wait())
            closed: asyncio.Future[Any] = conn.closed
            await asyncio.wait({synced, closed}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            synced.cancel()
            if not session.synced.is_set():
                if not conn.closed.done():
                    m.CONNECT_FAILURES.labels("no_sync").inc()
                    log.warning(
                        "NRI runtime did not configure and synchronize the plugin in time",
                        waited_s=wait,
                        configured=session.configured.is_set(),
                    )
                return False
            log.info(
                "NRI plugin connected",
                runtime=session.runtime,
                index=self.settings.plugin_index,
                name=self.settings.plugin_name,
            )
            err = await conn.wait_closed()
            log.warning(
                "NRI connection closed; reconnecting", reason=f"{type(err).__name__}: {err}" if err else "EOF"
            )
            return True
        except asyncio.CancelledError:
            log.info("NRI plugin stopping; closing the socket")
            raise
        finally:
            conn.close()
            session.registered = False
            if session.configured.is_set():
                self._publish_nowait(NRIConnectionChanged(False, session.runtime))
            obs.NRI_CONNECTED.set(0)

    async def _register(self, session: PluginSession, conn: NRIConnection) -> bool:
        req = api.RegisterPluginRequest(
            plugin_name=self.settings.plugin_name,
            plugin_idx=self.settings.plugin_index,
            NRI_version=NRI_VERSION,
        )
        try:
            resp = await conn.call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                req.SerializeToString(),
                self.settings.connect_timeout_seconds,
            )
        except (TimeoutException, ConnectionClosedError) as exc:
            m.CONNECT_FAILURES.labels("register").inc()
            log.warning("NRI registration failed", error=str(exc))
            return False
        if resp.status.code:
            # the runtime abandons the plugin without closing the socket: we close it
            m.CONNECT_FAILURES.labels("rejected").inc()
            log.error(
                "NRI runtime rejected the registration",
                code=resp.status.code,
                message=resp.status.message,
                name=self.settings.plugin_name,
                index=self.settings.plugin_index,
            )
            return False
        session.registered = True
        return True

    def _publish_nowait(self, event: Event) -> None:
        self.bus.publish_nowait(event)
