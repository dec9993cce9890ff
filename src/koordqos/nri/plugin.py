"""NRIPlugin: registers with the container runtime over NRI and reconnects when it goes.

The plugin lifecycle: connect (or use the socket the runtime launched us with), register, wait for Configure
and the whole Synchronize, serve until the connection closes, then reconnect with capped exponential backoff
and jitter (the runtime never reconnects by itself). Every new session (`nri/session.py`) re-registers and
is re-synchronized, which re-applies the hooks to every container.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.config import FailurePolicy, NRISettings
from koordqos.decisions import DecisionLog
from koordqos.errors import ConfigError, KoordQoSError, TimeoutException
from koordqos.events.types import Event, NRIConnectionChanged
from koordqos.hooks.core import call_deadline as hook_deadline
from koordqos.nri import telemetry as m
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.busypoll import spare_cpu
from koordqos.nri.connection import ConnectionClosedError, NRIConnection
from koordqos.nri.convert import resources_from_nri, summary
from koordqos.nri.limits import RuntimeObjectLimits
from koordqos.nri.mask import (
    DEFAULT_EVENTS,
    STAGE_EVENTS,
    VALID_EVENTS,
    event_bit,
    mask_without_stages,
    parse_event_mask,
    validate_event_mask,
)
from koordqos.nri.session import NRIHandler, PluginSession, no_hooks, parse_payload

log = structlog.get_logger("koordqos.nri")

__all__ = [
    "DEFAULT_EVENTS",
    "NRI_VERSION",
    "RUNTIME_SERVICE",
    "STAGE_EVENTS",
    "VALID_EVENTS",
    "NRINotConnectedError",
    "NRIPlugin",
    "PluginSession",
    "event_bit",
    "hook_deadline",
    "mask_without_stages",
    "parse_event_mask",
    "validate_event_mask",
]

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
NRI_VERSION = "v0.12.2"  # the protocol version our proto describes (only logged by the runtime)


class NRINotConnectedError(KoordQoSError):
    """An unsolicited call was attempted while the plugin is not registered with a runtime."""


class NRIPlugin:
    """The NRI plugin component: connect, register, serve, and reconnect with backoff until cancelled."""

    name = "nri"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        settings: NRISettings,
        *,
        handler: NRIHandler = no_hooks,
        failure_policy: FailurePolicy = "Ignore",
        events_mask: int = DEFAULT_EVENTS,
        status: MutableMapping[str, Any] | None = None,
        socket_fd: int | None = None,
        rng: random.Random | None = None,
        busy_poll_gate: Callable[[], bool] | None = None,
        decisions: DecisionLog | None = None,
    ) -> None:
        self.bus = bus
        self.decisions = decisions  # unsolicited updates are decisions (and nothing is sent in dry-run)
        self.settings = settings
        self.handler = handler
        self.failure_policy: FailurePolicy = failure_policy
        self.events_mask = validate_event_mask(events_mask)
        self.status = status if status is not None else {}
        self.socket_fd = socket_fd
        self._rng = rng or random.Random()
        self.session: PluginSession | None = None
        self.syncs = 0  # completed Synchronize exchanges over the life of the plugin
        self.sessions = 0
        self.timings: dict[str, list[float]] | None = None  # plugin-side seconds per method, when enabled
        self.limits = RuntimeObjectLimits(settings.max_pod_sandboxes, settings.max_containers)
        # whether a reply may open a busy-poll window: the agent passes a SpareCPU on its proc root
        self.busy_poll_gate = busy_poll_gate or (lambda: spare_cpu(self.bus.state))
        self.set_status("connecting")

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
        """Send unsolicited UpdateContainers; returns the updates the runtime failed to apply. Each update is
        a decision (`decisions`); in dry-run it is recorded as such and nothing is sent."""
        s = self.session
        if s is None or not s.registered or s.conn is None or not s.conn.is_open:
            raise NRINotConnectedError("NRI plugin is not registered with a runtime")
        if self.decisions is not None and self.decisions.dry_run:
            self._record_updates(updates, set(), dry=True)
            return []
        req = api.UpdateContainersRequest(update=list(updates))
        try:
            resp = await s.conn.call(
                RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), timeout or s.request_timeout
            )
        except ConnectionClosedError as exc:
            raise NRINotConnectedError(str(exc)) from None
        if resp.status.code:
            raise KoordQoSError(f"UpdateContainers failed: {resp.status.message} (code {resp.status.code})")
        out = parse_payload(api.UpdateContainersResponse, resp.payload, "UpdateContainersResponse")
        failed = list(out.failed)
        self._record_updates(updates, {u.container_id for u in failed}, dry=False)
        return failed

    def _record_updates(self, updates: Sequence[api.ContainerUpdate], failed: set[str], dry: bool) -> None:
        """One decision per update, named by the container NodeState knows ("<ns>/<pod>/<container>")."""
        if self.decisions is None:
            return
        state = self.bus.state
        for u in updates:
            ctr = state.containers.get(u.container_id)
            sb = state.sandboxes.get(ctr.sandbox_id) if ctr is not None else None
            target = (
                f"{sb.namespace}/{sb.name}/{ctr.name}"
                if ctr is not None and sb is not None
                else f"container {u.container_id}"
            )
            res = resources_from_nri(u.linux.resources) if u.HasField("linux") else None
            reason = "UpdateContainers" + (" (failed by the runtime)" if u.container_id in failed else "")
            new = summary(res) if res is not None else ""
            self.decisions.record("runtime-hooks", target, "nri-update", None, new, reason, dry_run=dry)

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
                self.set_status("backoff")
                log.debug("NRI reconnecting", retry_in_s=round(delay, 3), failures=failures)
                await asyncio.sleep(delay)
        finally:
            self.set_status("stopped")

    def backoff(self, attempt: int) -> float:
        """Delay before attempt `attempt` (1-based): base·2^(n-1) capped, with ±10 % jitter."""
        s = self.settings
        delay = min(s.backoff_cap_seconds, s.backoff_seconds * 2 ** min(attempt - 1, 32))
        return float(delay * (1 + self._rng.uniform(-0.1, 0.1)))

    def set_status(self, value: str) -> None:
        self.status["nri"] = value

    async def _open(self, session: PluginSession) -> NRIConnection:
        loop = asyncio.get_running_loop()

        def factory() -> NRIConnection:
            return NRIConnection(
                session.handle,
                role="plugin",
                busy_poll=self.settings.busy_poll_seconds,
                busy_poll_gate=self.busy_poll_gate,
            )

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
        self.set_status("connecting")
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
            self.set_status("registering")
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
            session.close()
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
