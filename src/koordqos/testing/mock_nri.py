"""MockRuntime: the runtime side of NRI (containerd's pkg/adaptation) on a real unix socket.

It listens like a runtime, accepts a plugin, serves the runtime service on conn 2 (RegisterPlugin,
UpdateContainers), sends Configure (before the RegisterPlugin reply, as the real runtime does) and
Synchronize (chunked with `more` when large or when asked), drives pod and container lifecycle events
(dedicated RPCs with the UNIMPLEMENTED → StateChange fallback, or StateChange only as on NRI < v0.12), and
records the replies. It enforces the rules that make a real runtime drop a plugin: the registration timeout,
the request timeout, the Go reader's frame-size rule (> 4096 bytes between messages, or two messages in
one frame), odd increasing stream ids, a valid event mask and the `more` echo. A dropped plugin has its
socket closed and `link.drop_reason` says why.

Usable from tests (in-process), from benchmarks in another process (`python -m koordqos.testing.mock_nri`)
and from a demo.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message as ProtoMessage

from koordqos.errors import KoordQoSError, ProtocolError, TimeoutException
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.api import ttrpc_pb2
from koordqos.nri.connection import ConnectionClosedError, NRIConnection
from koordqos.nri.mux import GO_READ_BUFFER, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from koordqos.nri.ttrpc import HEADER_SIZE, MAX_DATA_SIZE, Code, TtrpcDecoder, encode_response

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

R = TypeVar("R", bound=ProtoMessage)

# Events without a StateChange fallback: answering UNIMPLEMENTED there fails the operation.
_NO_FALLBACK = {"CreateContainer", "UpdateContainer", "StopContainer", "UpdatePodSandbox"}
_EVENT_OF_METHOD = {
    "RunPodSandbox": api.RUN_POD_SANDBOX,
    "StopPodSandbox": api.STOP_POD_SANDBOX,
    "RemovePodSandbox": api.REMOVE_POD_SANDBOX,
    "CreateContainer": api.CREATE_CONTAINER,
    "PostCreateContainer": api.POST_CREATE_CONTAINER,
    "StartContainer": api.START_CONTAINER,
    "PostStartContainer": api.POST_START_CONTAINER,
    "UpdateContainer": api.UPDATE_CONTAINER,
    "PostUpdateContainer": api.POST_UPDATE_CONTAINER,
    "StopContainer": api.STOP_CONTAINER,
    "RemoveContainer": api.REMOVE_CONTAINER,
}


class RuntimeCallError(KoordQoSError):
    """The plugin answered a runtime call with an error status (the runtime operation fails)."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"NRI {method} failed: {message} (code {code})")
        self.method = method
        self.code = code
        self.message = message


class PluginDroppedError(KoordQoSError):
    """The runtime dropped the plugin (timeout, protocol violation, …) during a call."""


def go_frame_check(conn_id: int, payload: bytes, decoder: TtrpcDecoder) -> None:
    """Raise ProtocolError for a frame the Go mux + ttrpc reader could not take (nri-protocol §2.2)."""
    if decoder.buffered == 0:
        if len(payload) > GO_READ_BUFFER:
            raise ProtocolError(
                f"frame of {len(payload)} bytes on conn {conn_id} arrived between messages "
                f"(> {GO_READ_BUFFER}: the Go reader fails with ENOMEM)"
            )
        if len(payload) >= HEADER_SIZE:
            total = HEADER_SIZE + int.from_bytes(payload[:4], "big")
            if len(payload) > total:
                raise ProtocolError(f"frame on conn {conn_id} packs more than one ttrpc message")
        return
    remaining = decoder.remaining()
    if remaining is None:
        if len(payload) > GO_READ_BUFFER:
            raise ProtocolError(f"frame of {len(payload)} bytes on conn {conn_id} in the middle of a header")
    elif len(payload) > remaining:
        raise ProtocolError(f"frame on conn {conn_id} packs the tail of one ttrpc message with the next")


@dataclass(eq=False)
class PluginLink:
    """One accepted plugin connection and everything the runtime learned from it."""

    conn: NRIConnection
    accepted_at: float
    name: str = ""
    index: str = ""
    nri_version: str = ""
    events: int = 0
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    configured: asyncio.Event = field(default_factory=asyncio.Event)
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: asyncio.Event = field(default_factory=asyncio.Event)
    drop_reason: str = ""
    register_rejected: str = ""
    fallback: set[str] = field(default_factory=set)  # events moved to StateChange after UNIMPLEMENTED
    sync_chunks: int = 0
    sync_replies: list[api.SynchronizeResponse] = field(default_factory=list)
    sync_seconds: float = 0.0
    update_requests: list[api.UpdateContainersRequest] = field(default_factory=list)

    @property
    def sync_updates(self) -> list[api.ContainerUpdate]:
        """The updates of the final Synchronize reply."""
        return list(self.sync_replies[-1].update) if self.sync_replies else []


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

        async def serve(req: ttrpc_pb2.Request, received: float) -> bytes:
            return await self._serve_runtime(holder[0], req)

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

    async def _serve_runtime(self, link: PluginLink, req: ttrpc_pb2.Request) -> bytes:
        if req.service != RUNTIME_SERVICE:
            return encode_response(code=Code.UNIMPLEMENTED, message=f"service {req.service}")
        if req.method == "RegisterPlugin":
            reg = api.RegisterPluginRequest()
            reg.ParseFromString(req.payload)
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
            upd.ParseFromString(req.payload)
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
            ev = _EVENT_OF_METHOD[method]
            if not link.events & (1 << (ev - 1)):
                return None
            started = time.monotonic()
            use_state_change = method not in _NO_FALLBACK and (
                not self.dedicated_rpcs or method in link.fallback
            )
            if not use_state_change:
                try:
                    resp = await self._call(link, method, req, resp_cls, started)
                    self._check_reply(link, method, req, resp)
                    self.calls.append((method, resp))
                    return resp
                except RuntimeCallError as exc:
                    if exc.code != Code.UNIMPLEMENTED or method in _NO_FALLBACK:
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
        """What pkg/adaptation refuses in a reply (§7.2): the operation then fails, as on a real runtime."""
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


# -- sample data ------------------------------------------------------------------------------------


def sample_pod(i: int, qos: str = "besteffort") -> api.PodSandbox:
    """A realistic pod sandbox as containerd reports it (cgroupfs driver)."""
    uid = f"0000{i:04d}-1a2b-4c3d-8e9f-{i:012d}"
    parent = f"/kubepods/{qos}/pod{uid}" if qos != "guaranteed" else f"/kubepods/pod{uid}"
    pod = api.PodSandbox(
        id=f"{i:08x}" + "ab" * 28,
        name=f"pod-{i}",
        uid=uid,
        namespace="default",
        labels={
            "app": f"app-{i % 17}",
            "io.kubernetes.pod.name": f"pod-{i}",
            "io.kubernetes.pod.namespace": "default",
            "io.kubernetes.pod.uid": uid,
        },
        annotations={
            "kubernetes.io/config.seen": "2026-08-20T10:00:00Z",
            "kubernetes.io/config.source": "api",
            "koordinator.sh/qosClass": "BE" if qos == "besteffort" else "LS",
        },
        runtime_handler="runc",
        ips=[f"10.1.{i // 250}.{i % 250 + 1}"],
    )
    pod.linux.cgroup_parent = parent
    pod.linux.pod_resources.cpu.shares.value = 2
    pod.linux.namespaces.add(type="network", path=f"/var/run/netns/cni-{i}")
    return pod


def sample_container(pod: api.PodSandbox, j: int, state: int = api.CONTAINER_RUNNING) -> api.Container:
    """A realistic container of `pod` (env, mounts, resources, cgroups path)."""
    cid = f"{j:04x}" + pod.id[4:]
    ctr = api.Container(
        id=cid,
        pod_sandbox_id=pod.id,
        name=f"c{j}",
        state=state,  # type: ignore[arg-type]
        labels={"io.kubernetes.container.name": f"c{j}", "io.kubernetes.pod.uid": pod.uid},
        annotations={"io.kubernetes.container.hash": "1a2b3c4d", "io.kubernetes.container.restartCount": "0"},
        args=["/bin/app", "--serve", f"--port={8000 + j}"],
        env=[
            "KUBERNETES_SERVICE_HOST=10.96.0.1",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            f"POD_NAME={pod.name}",
        ],
        pid=10000 + j,
    )
    for dest in ("/etc/hosts", "/dev/termination-log", "/var/run/secrets/kubernetes.io/serviceaccount"):
        ctr.mounts.add(
            destination=dest,
            type="bind",
            source=f"/var/lib/kubelet/pods/{pod.uid}{dest}",
            options=["rbind", "rprivate", "rw"],
        )
    res = ctr.linux.resources
    res.cpu.shares.value = 2
    res.cpu.quota.value = -1
    res.cpu.period.value = 100000
    res.memory.limit.value = 0
    ctr.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{cid}"
    ctr.linux.oom_score_adj.value = 1000
    return ctr


def sample_node(pods: int, containers_per_pod: int) -> tuple[list[api.PodSandbox], list[api.Container]]:
    """`pods` sample pods with `containers_per_pod` containers each."""
    ps = [sample_pod(i) for i in range(pods)]
    return ps, [sample_container(p, j) for p in ps for j in range(containers_per_pod)]


# -- command line (demo) ----------------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> None:
    rt = MockRuntime(args.socket, request_timeout=args.request_timeout)
    rt.pods, rt.containers = sample_node(args.pods, args.containers_per_pod)
    async with rt:
        print(f"mock NRI runtime listening on {args.socket}", flush=True)
        seen = 0
        while True:
            link = await rt.wait_joined(timeout=3600, after=seen)
            seen = rt.links.index(link) + 1
            print(
                f"plugin {link.index}-{link.name} joined: events={link.events:#x} "
                f"sync={link.sync_seconds * 1000:.1f} ms updates={len(link.sync_updates)}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    """`python -m koordqos.testing.mock_nri --socket PATH`: serve plugins with a synthetic node."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--socket", required=True)
    p.add_argument("--pods", type=int, default=10)
    p.add_argument("--containers-per-pod", type=int, default=2)
    p.add_argument("--request-timeout", type=float, default=2.0)
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
