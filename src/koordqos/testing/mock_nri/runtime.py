"""MockRuntime: the runtime side of NRI on a real unix socket (see `koordqos.testing.mock_nri`).

The socket server, the runtime service on conn 2 (RegisterPlugin, UpdateContainers), Configure and
Synchronize, the lifecycle events and the timeouts that make a real runtime drop a plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message as ProtoMessage

from koordqos.errors import TimeoutException
from koordqos.nri.answer import Answer
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.api import ttrpc_pb2
from koordqos.nri.connection import ConnectionClosedError, NRIConnection
from koordqos.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from koordqos.nri.ttrpc import MAX_DATA_SIZE, Code, RequestEnvelope, as_buffer, encode_response
from koordqos.testing.mock_nri.link import PluginLink
from koordqos.testing.mock_nri.protocol import (
    EVENT_OF_METHOD,
    NO_FALLBACK,
    PLUGIN_SERVICE,
    RUNTIME_SERVICE,
    PluginDroppedError,
    RuntimeCallError,
    go_frame_check,
)

R = TypeVar("R", bound=ProtoMessage)


class MockRuntime:
    """An NRI runtime on a unix socket (see the module docstring)."""

    def __init__(
        self,
        socket_path: str | Path,
        *,
        request_timeout: float = 2.0,
        registration_timeout: float = 5.0,
        runtime_name: str = "mock-containerd",
        runtime_version: str = "2.3.0",
        nri_version: str = "v0.12.2",
        dedicated_rpcs: bool = True,
        plugin_config: str = "",
        sync_chunk: int | None = None,
        configure_before_register_reply: bool = True,
        hold_register_reply: bool = False,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.request_timeout = request_timeout
        self.registration_timeout = registration_timeout
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        self.nri_version = nri_version
        self.dedicated_rpcs = dedicated_rpcs
        self.plugin_config = plugin_config
        self.sync_chunk = sync_chunk
        self.configure_before_register_reply = configure_before_register_reply
        # stricter than containerd: answer RegisterPlugin only after the plugin answered Configure, so a
        # plugin that waits for the registration reply before serving conn 1 deadlocks (and is dropped)
        self.hold_register_reply = hold_register_reply
        self.pods: list[api.PodSandbox] = []
        self.containers: list[api.Container] = []
        self.links: list[PluginLink] = []
        self.calls: list[tuple[str, ProtoMessage | None]] = []
        self.update_handler: (
            Callable[[api.UpdateContainersRequest], Awaitable[list[api.ContainerUpdate]]] | None
        )
        self.update_handler = None
        self._server: asyncio.AbstractServer | None = None
        self._lock = asyncio.Lock()  # the runtime serializes all events
        self._new_link = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- listening --------------------------------------------------------------------------------

    @property
    def valid_events(self) -> int:
        """The event bits this runtime version accepts."""
        major_minor = re.match(r"v?(\d+)\.(\d+)", self.nri_version)
        newer = major_minor is not None and (int(major_minor[1]), int(major_minor[2])) >= (0, 10)
        return 0x3FFF if newer else 0x07FF

    async def start(self) -> None:
        """Remove a stale socket, create the parent directory and listen."""
        self.socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._make_conn, str(self.socket_path))

    async def stop(self) -> None:
        """Stop listening, drop every plugin, remove the socket (a runtime going away)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in self.links:
            self._drop(link, "runtime stopped")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def __aenter__(self) -> MockRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def adopt(self, sock: socket.socket) -> PluginLink:
        """Serve a plugin over an already-connected socket (a pre-launched plugin's socketpair end)."""
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(self._make_conn, sock)
        return self.links[-1]

    def inject(self, data: bytes, link: PluginLink | None = None) -> None:
        """Write raw bytes to a plugin (for robustness tests: garbage, oversize, bad stream ids)."""
        target = link or self.link
        if target is None:
            raise PluginDroppedError("no plugin connection")
        target.conn.write_raw(data)

    def _make_conn(self) -> NRIConnection:
        holder: list[PluginLink] = []

        def serve(req: RequestEnvelope, received: float) -> Answer:
            return Answer(later=self._serve_runtime(holder[0], req))

        conn = NRIConnection(
            serve,
            role="runtime",
            serve_conn=RUNTIME_SERVICE_CONN,
            client_conn=PLUGIN_SERVICE_CONN,
            frame_check=go_frame_check,
        )
        link = PluginLink(conn, time.monotonic())
        holder.append(link)
        self.links.append(link)
        self._new_link.set()
        self._spawn(self._watch(link))
        return conn

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, link: PluginLink) -> None:
        """Registration timeout, and the reason when the connection goes."""
        closed: asyncio.Future[Any] = link.conn.closed
        registered: asyncio.Future[Any] = asyncio.ensure_future(link.registered.wait())
        try:
            await asyncio.wait(
                {closed, registered}, timeout=self.registration_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            registered.cancel()
        if not link.registered.is_set() and not closed.done():
            self._drop(link, "plugin registration timed out")
        err = await link.conn.wait_closed()
        if not link.dropped.is_set():
            self._drop(link, f"protocol error: {err}" if err else "plugin closed the connection")

    def _drop(self, link: PluginLink, reason: str) -> None:
        if link.dropped.is_set():
            return
        link.drop_reason = reason
        link.dropped.set()
        link.conn.close()

    # -- waiting ----------------------------------------------------------------------------------

    @property
    def link(self) -> PluginLink | None:
        """The newest plugin connection."""
        return self.links[-1] if self.links else None

    async def wait_joined(self, timeout: float = 5.0, after: int = 0) -> PluginLink:
        """Wait for a plugin (the `after`-th connection or later) to register, configure and synchronize."""
        async with asyncio.timeout(timeout):
            while True:
                for link in self.links[after:]:
                    if link.joined.is_set() and not link.dropped.is_set():
                        return link
                self._new_link.clear()
                waits = [asyncio.ensure_future(self._new_link.wait())]
                waits += [asyncio.ensure_future(lk.joined.wait()) for lk in self.links[after:]]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()

    # -- runtime service (conn 2) -----------------------------------------------------------------

    async def _serve_runtime(self, link: PluginLink, req: RequestEnvelope) -> bytes:
        if req.service != RUNTIME_SERVICE:
            return encode_response(code=Code.UNIMPLEMENTED, message=f"service {req.service}")
        if req.method == "RegisterPlugin":
            reg = api.RegisterPluginRequest()
            reg.ParseFromString(as_buffer(req.payload))
            problem = ""
            if not re.fullmatch(r"[0-9]{2}", reg.plugin_idx):
                problem = f"invalid plugin index {reg.plugin_idx!r}, must be 2 digits"
            elif not re.fullmatch(r"[a-zA-Z0-9_.+-]+", reg.plugin_name):
                problem = f"invalid plugin name {reg.plugin_name!r}"
            if problem:
                # like pkg/adaptation: the plugin is abandoned but the socket is left open
                link.register_rejected = problem
                return encode_response(code=Code.UNKNOWN, message=problem)
            link.name, link.index, link.nri_version = reg.plugin_name, reg.plugin_idx, reg.NRI_version
            link.registered.set()
            self._spawn(self._configure_and_sync(link))
            if self.configure_before_register_reply:
                await asyncio.sleep(0)  # let Configure reach the socket before this reply (as containerd)
            if self.hold_register_reply:
                await link.configured.wait()
            return b""
        if req.method == "UpdateContainers":
            upd = api.UpdateContainersRequest()
            upd.ParseFromString(as_buffer(req.payload))
            link.update_requests.append(upd)
            failed = await self.update_handler(upd) if self.update_handler else []
            return encode_response(api.UpdateContainersResponse(failed=failed).SerializeToString())
        return encode_response(code=Code.UNIMPLEMENTED, message=f"method {req.method}")

    # -- configure and synchronize ----------------------------------------------------------------

    async def _configure_and_sync(self, link: PluginLink) -> None:
        async with self._lock:
            try:
                cfg = api.ConfigureRequest(
                    config=self.plugin_config,
                    runtime_name=self.runtime_name,
                    runtime_version=self.runtime_version,
                    registration_timeout=int(self.registration_timeout * 1000),
                    request_timeout=int(self.request_timeout * 1000),
                    NRI_version=self.nri_version,
                )
                resp = await self._call(link, "Configure", cfg, api.ConfigureResponse, time.monotonic())
                events = resp.events or self.valid_events  # 0 means "everything" (validation included)
                if events & ~self.valid_events:
                    self._drop(link, f"failed to configure plugin: invalid plugin events: {events:#x}")
                    return
                link.events = events
                link.configured.set()
                await self._synchronize(link)
                link.joined.set()
            except (RuntimeCallError, PluginDroppedError) as exc:
                self._drop(link, f"failed to configure or synchronize plugin: {exc}")

    def _sync_chunks(self) -> list[api.SynchronizeRequest]:
        pods, ctrs = list(self.pods), list(self.containers)
        if self.sync_chunk:
            n = self.sync_chunk
            count = max((len(pods) + n - 1) // n, (len(ctrs) + n - 1) // n, 1)
            chunks = [
                api.SynchronizeRequest(pods=pods[i * n : (i + 1) * n], containers=ctrs[i * n : (i + 1) * n])
                for i in range(count)
            ]
        else:
            # like pkg/adaptation: try everything at once, shrink while a message would exceed 4 MiB
            parts = 1
            while True:
                pn, cn = -(-len(pods) // parts), -(-len(ctrs) // parts)
                chunks = [
                    api.SynchronizeRequest(
                        pods=pods[i * pn : (i + 1) * pn], containers=ctrs[i * cn : (i + 1) * cn]
                    )
                    for i in range(parts)
                ]
                if all(c.ByteSize() + 64 <= MAX_DATA_SIZE for c in chunks):
                    break
                parts += 1
        for c in chunks[:-1]:
            c.more = True
        return chunks

    async def _synchronize(self, link: PluginLink) -> None:
        started = time.monotonic()  # one request timeout covers the whole chunked exchange
        chunks = self._sync_chunks()
        link.sync_chunks = len(chunks)
        for chunk in chunks:
            resp = await self._call(link, "Synchronize", chunk, api.SynchronizeResponse, started)
            link.sync_replies.append(resp)
            if chunk.more and (not resp.more or len(resp.update)):
                raise PluginDroppedError("plugin does not handle split sync requests")
        link.sync_seconds = time.monotonic() - started

    # -- calling the plugin -----------------------------------------------------------------------

    async def _call(
        self, link: PluginLink, method: str, req: ProtoMessage, resp_cls: type[R], started: float
    ) -> R:
        """One plugin-service call under the request timeout (measured from `started`)."""
        left = self.request_timeout - (time.monotonic() - started)
        if link.dropped.is_set():
            raise PluginDroppedError(f"plugin already dropped: {link.drop_reason}")
        try:
            raw = await link.conn.call(PLUGIN_SERVICE, method, req.SerializeToString(), max(left, 0.001))
        except TimeoutException:
            self._drop(link, f"closing plugin, failed to handle {method} request: context deadline exceeded")
            raise PluginDroppedError(link.drop_reason) from None
        except ConnectionClosedError:
            if not link.dropped.is_set():
                self._drop(link, f"failed to handle {method} request: ttrpc: closed")
            raise PluginDroppedError(link.drop_reason) from None
        if raw.status.code:
            raise RuntimeCallError(method, raw.status.code, raw.status.message)
        out = resp_cls()
        try:
            out.ParseFromString(raw.payload)
        except Exception as exc:  # a reply that does not parse: the runtime closes the plugin
            self._drop(link, f"{method}: undecodable reply: {exc}")
            raise PluginDroppedError(link.drop_reason) from None
        return out

    async def call_raw(
        self, method: str, payload: bytes = b"", service: str = PLUGIN_SERVICE
    ) -> ttrpc_pb2.Response:
        """Send any method to the current plugin and return the raw Response envelope (no rules applied)."""
        link = self._active()
        return await link.conn.call(service, method, payload, self.request_timeout)

    def _active(self) -> PluginLink:
        link = self.link
        if link is None or link.dropped.is_set() or not link.joined.is_set():
            raise PluginDroppedError("no active plugin")
        return link

    async def event(self, method: str, req: ProtoMessage, resp_cls: type[R]) -> R | None:
        """Relay one lifecycle event like pkg/adaptation; None when the plugin is not subscribed to it.

        Raises RuntimeCallError when the plugin answers with an error (the operation fails) and
        PluginDroppedError when the runtime dropped the plugin for it (the operation goes on without it).
        """
        async with self._lock:
            link = self._active()
            ev = EVENT_OF_METHOD[method]
            if not link.events & (1 << (ev - 1)):
                return None
            started = time.monotonic()
            use_state_change = method not in NO_FALLBACK and (
                not self.dedicated_rpcs or method in link.fallback
            )
            if not use_state_change:
                try:
                    resp = await self._call(link, method, req, resp_cls, started)
                    self._check_reply(link, method, req, resp)
                    self.calls.append((method, resp))
                    return resp
                except RuntimeCallError as exc:
                    if exc.code != Code.UNIMPLEMENTED or method in NO_FALLBACK:
                        self.calls.append((method, None))
                        raise
                    link.fallback.add(method)
            pod = getattr(req, "pod", None)
            sc = api.StateChangeEvent(event=ev, pod=pod)
            if hasattr(req, "container"):
                sc.container.CopyFrom(req.container)
            await self._call(link, "StateChange", sc, api.Empty, started)
            self.calls.append(("StateChange:" + method, None))
            return resp_cls()

    @staticmethod
    def _check_reply(link: PluginLink, method: str, req: ProtoMessage, resp: ProtoMessage) -> None:
        """What pkg/adaptation refuses in a reply (docs/behaviour-nri.md): the operation then fails, as on a
        real runtime."""
        updates = getattr(resp, "update", ())
        if method == "CreateContainer":
            own = req.container.id  # type: ignore[attr-defined]
            if any(u.container_id == own for u in updates):
                raise RuntimeCallError(
                    method,
                    Code.UNKNOWN,
                    f"plugin {link.index}-{link.name} asked update of {own} during creation",
                )
        if method in ("CreateContainer", "UpdateContainer", "StopContainer") and any(
            not u.container_id for u in updates
        ):
            raise RuntimeCallError(
                method,
                Code.UNKNOWN,
                f"plugin {link.index}-{link.name} sent an update without a container id",
            )

    # convenience wrappers -----------------------------------------------------------------------

    async def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """RunPodSandbox."""
        await self.event("RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.RunPodSandboxResponse)

    async def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """StopPodSandbox."""
        await self.event("StopPodSandbox", api.StopPodSandboxRequest(pod=pod), api.StopPodSandboxResponse)

    async def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """RemovePodSandbox."""
        await self.event(
            "RemovePodSandbox", api.RemovePodSandboxRequest(pod=pod), api.RemovePodSandboxResponse
        )

    async def create_container(
        self, pod: api.PodSandbox, ctr: api.Container
    ) -> api.CreateContainerResponse | None:
        """CreateContainer: the plugin's adjustment and updates."""
        return await self.event(
            "CreateContainer", api.CreateContainerRequest(pod=pod, container=ctr), api.CreateContainerResponse
        )

    async def start_container(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        """StartContainer then PostStartContainer."""
        await self.event(
            "StartContainer", api.StartContainerRequest(pod=pod, container=ctr), api.StartContainerResponse
        )
        await self.event(
            "PostStartContainer",
            api.PostStartContainerRequest(pod=pod, container=ctr),
            api.PostStartContainerResponse,
        )

    async def update_container(
        self, pod: api.PodSandbox, ctr: api.Container, resources: api.LinuxResources
    ) -> api.UpdateContainerResponse | None:
        """UpdateContainer: the plugin's updates."""
        req = api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=resources)
        return await self.event("UpdateContainer", req, api.UpdateContainerResponse)

    async def stop_container(
        self, pod: api.PodSandbox, ctr: api.Container
    ) -> api.StopContainerResponse | None:
        """StopContainer: the plugin's updates for the remaining containers."""
        return await self.event(
            "StopContainer", api.StopContainerRequest(pod=pod, container=ctr), api.StopContainerResponse
        )

    async def remove_container(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        """RemoveContainer."""
        await self.event(
            "RemoveContainer", api.RemoveContainerRequest(pod=pod, container=ctr), api.RemoveContainerResponse
        )
