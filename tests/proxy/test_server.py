"""ProxyServer socket hygiene and the koord-runtime-proxy registration file."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import FailurePolicy
from koordqos.errors import ConfigError
from koordqos.hooks.context import HookContext, Stage
from koordqos.hooks.core import Call
from koordqos.hooks.framework import HookRegistry
from koordqos.hooks.runtime import HookOptions, RuntimeHooks
from koordqos.observability import REGISTRY
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.proxy.api.runtime_api_grpc import RuntimeHookServiceStub
from koordqos.proxy.convert import ProxyConverter
from koordqos.proxy.registration import RegistrationFile, proxy_stages, render_registration
from koordqos.proxy.server import CLOSED_STREAMS_KEPT, CorkedTransport, ProxyServer, _CorkedServer, corked
from koordqos.proxy.service import RuntimeHookService
from koordqos.testing.poll import wait_until

from .conftest import running_agent


def make_server(base: Path, registration: RegistrationFile | None = None) -> ProxyServer:
    """A server with no hooks attached to its bus (replies are the pre-filled requests)."""
    layout = CgroupLayout(base / "cgroup", CgroupVersion.V1, CgroupDriver.CGROUPFS)
    service = RuntimeHookService(EventBus(), ProxyConverter(layout))
    return ProxyServer(service, base / "run" / "koordlet.sock", registration, refresh_interval=0.05)


@asynccontextmanager
async def served(server: ProxyServer) -> AsyncIterator[RuntimeHookServiceStub]:
    await server.start()
    channel = Channel(path=str(server.socket_path))
    try:
        yield RuntimeHookServiceStub(channel)
    finally:
        channel.close()
        await server.stop()


def stale_socket(path: Path) -> None:
    """Leave a socket file nobody listens on (as a crashed agent does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


async def _answers(stub: RuntimeHookServiceStub) -> bool:
    req = rpb.PodSandboxHookRequest(
        pod_meta=rpb.PodSandboxMetadata(uid="u1", name="p", namespace="ns"), cgroup_parent="/kubepods/podu1"
    )
    resp = await stub.PreRunPodSandboxHook(req)
    return resp is not None and resp.cgroup_parent == "/kubepods/podu1"


async def test_stale_socket_is_replaced_mode_0600_and_removed_at_exit(short_dir: Path) -> None:
    server = make_server(short_dir)
    stale_socket(server.socket_path)
    os.chmod(server.socket_path, 0o777)
    async with served(server) as stub:
        st = os.lstat(server.socket_path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert await _answers(stub)
        assert REGISTRY.get_sample_value("koordqos_proxy_serving") == 1
    assert not server.socket_path.exists()
    assert REGISTRY.get_sample_value("koordqos_proxy_serving") == 0


async def test_a_path_that_is_not_a_socket_is_refused(short_dir: Path) -> None:
    server = make_server(short_dir)
    server.socket_path.parent.mkdir(parents=True)
    server.socket_path.write_text("precious")
    with pytest.raises(ConfigError, match="not a socket"):
        await server.start()
    assert server.socket_path.read_text() == "precious"


async def test_a_live_server_is_not_taken_over(short_dir: Path) -> None:
    first = make_server(short_dir)
    second = make_server(short_dir)
    async with served(first) as stub:
        with pytest.raises(ConfigError, match="another process"):
            await second.start()
        assert await _answers(stub)  # the first one still serves its socket


async def test_a_replaced_socket_is_left_alone_at_exit(short_dir: Path) -> None:
    server = make_server(short_dir)
    await server.start()
    os.unlink(server.socket_path)
    stale_socket(server.socket_path)  # a successor's socket
    await server.stop()
    assert stat.S_ISSOCK(os.lstat(server.socket_path).st_mode)


async def test_overlong_socket_path_is_a_config_error(short_dir: Path) -> None:
    layout = CgroupLayout(short_dir / "cgroup", CgroupVersion.V1, CgroupDriver.CGROUPFS)
    service = RuntimeHookService(EventBus(), ProxyConverter(layout))
    server = ProxyServer(service, short_dir / ("x" * 120) / "koordlet.sock")
    with pytest.raises(ConfigError, match="longer than"):
        await server.start()


# -- registration file ------------------------------------------------------------------------------------


def _noop(ctx: object) -> None:
    return None


def test_stages_have_fixed_order_and_only_rpc_stages() -> None:
    registry = HookRegistry()
    # registered in scrambled order, plus a stage without an RPC
    for stage in (
        Stage.PRE_UPDATE_CONTAINER_RESOURCES,
        Stage.PRE_REMOVE_RUN_POD_SANDBOX,
        Stage.POST_STOP_CONTAINER,
        Stage.PRE_RUN_POD_SANDBOX,
        Stage.PRE_CREATE_CONTAINER,
    ):
        registry.register(stage, "h", "", _noop)
    assert proxy_stages(registry) == [
        Stage.PRE_RUN_POD_SANDBOX,
        Stage.PRE_CREATE_CONTAINER,
        Stage.PRE_UPDATE_CONTAINER_RESOURCES,
        Stage.POST_STOP_CONTAINER,
    ]
    assert proxy_stages(registry, [Stage.PRE_CREATE_CONTAINER]) == [
        Stage.PRE_RUN_POD_SANDBOX,
        Stage.PRE_UPDATE_CONTAINER_RESOURCES,
        Stage.POST_STOP_CONTAINER,
    ]
    text = render_registration("/var/run/koordlet/koordlet.sock", "Fail", reversed(proxy_stages(registry)))
    assert json.loads(text) == {
        "remote-endpoint": "/var/run/koordlet/koordlet.sock",
        "failure-policy": "Fail",
        "runtime-hooks": [
            "PreRunPodSandbox",
            "PreCreateContainer",
            "PreUpdateContainerResources",
            "PostStopContainer",
        ],
    }
    assert list(json.loads(text)) == ["remote-endpoint", "failure-policy", "runtime-hooks"]


def test_default_hooks_register_their_three_stages() -> None:
    stages = proxy_stages(RuntimeHooks(HookOptions()).registry)
    assert stages == [
        Stage.PRE_RUN_POD_SANDBOX,
        Stage.PRE_CREATE_CONTAINER,
        Stage.PRE_UPDATE_CONTAINER_RESOURCES,
    ]


async def test_registration_file_written_at_start_and_kept_current(short_dir: Path) -> None:
    async with running_agent(short_dir, policy="Fail") as env:
        path = env.config_dir / "koordlet.json"
        # written once the socket accepts calls (the component is started)
        doc = json.loads(path.read_text())
        assert doc == {
            # issue #15 item 12: --runtime-hooks-host-endpoint (default koordlet's), not the listen path
            "remote-endpoint": "/var/run/koordlet/koordlet.sock",
            "failure-policy": "Fail",
            "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"],
        }
        original = path.read_text()
        path.unlink()
        await wait_until(path.exists, message=f"{path} written")
        assert path.read_text() == original
        path.write_text('{"remote-endpoint": "/elsewhere"}')
        await wait_until(lambda: path.read_text() == original, message=f"{path} restored")
        assert [p.name for p in env.config_dir.iterdir()] == ["koordlet.json"]  # no temp files left
        assert stat.S_IMODE(os.stat(env.sock).st_mode) == 0o600
    assert not env.sock.exists()  # removed when the agent stopped


async def test_the_registration_endpoint_is_the_host_endpoint_flag(short_dir: Path) -> None:
    # the agent listens on a container path; koord-runtime-proxy on the host dials the host path
    async with running_agent(
        short_dir, hooks_extra={"proxy_host_endpoint": "/run/koordlet/hooks.sock"}
    ) as env:
        doc = json.loads((env.config_dir / "koordlet.json").read_text())
        assert doc["remote-endpoint"] == "/run/koordlet/hooks.sock"
        assert str(env.sock) != doc["remote-endpoint"]


def _sample() -> rpb.PodSandboxHookRequest:
    return rpb.PodSandboxHookRequest(
        pod_meta=rpb.PodSandboxMetadata(uid="u1", name="p", namespace="ns"), cgroup_parent="/kubepods/podu1"
    )


async def test_a_request_over_the_size_limit_is_refused_and_the_server_stays_up(short_dir: Path) -> None:
    # issue #15 item 4: a 64 MiB request was answered OK (grpc-go refuses > 4 MiB)
    server = make_server(short_dir)
    assert server.service.max_message_bytes == 4 << 20
    refused = REGISTRY.get_sample_value(
        "koordqos_proxy_requests_total", {"method": "PreRunPodSandboxHook", "outcome": "resource_exhausted"}
    )
    async with served(server) as stub:
        big = _sample()
        big.annotations["x"] = "y" * (5 << 20)
        with pytest.raises(GRPCError) as info:
            await stub.PreRunPodSandboxHook(big)
        assert info.value.status is Status.RESOURCE_EXHAUSTED
        assert "larger than max" in (info.value.message or "")
        just_under = _sample()
        just_under.annotations["x"] = "y" * ((4 << 20) - 200)
        assert (await stub.PreRunPodSandboxHook(just_under)).cgroup_parent == "/kubepods/podu1"
        assert await _answers(stub)
    after = REGISTRY.get_sample_value(
        "koordqos_proxy_requests_total", {"method": "PreRunPodSandboxHook", "outcome": "resource_exhausted"}
    )
    assert (after or 0) == (refused or 0) + 1


async def test_connections_past_the_cap_are_closed_and_the_server_stays_up(short_dir: Path) -> None:
    # issue #15 item 4: 1,500 held connections used 1,306 fds
    layout = CgroupLayout(short_dir / "cgroup", CgroupVersion.V1, CgroupDriver.CGROUPFS)
    service = RuntimeHookService(EventBus(), ProxyConverter(layout))
    server = ProxyServer(service, short_dir / "run" / "koordlet.sock", max_connections=5)
    refused_before = REGISTRY.get_sample_value("koordqos_proxy_refused_connections_total") or 0
    held: list[socket.socket] = []
    async with served(server) as stub:
        assert await _answers(stub)  # the stub's own connection: 1 of 5
        try:
            for _ in range(20):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(server.socket_path))
                held.append(s)
            await wait_until(
                lambda: (
                    (REGISTRY.get_sample_value("koordqos_proxy_refused_connections_total") or 0)
                    >= refused_before + 16
                ),
                message="connections past the cap refused",
            )
            assert REGISTRY.get_sample_value("koordqos_proxy_open_connections") == 5
            assert await _answers(stub)  # an open connection keeps working
            for s in held:
                s.close()
            held.clear()
            await wait_until(
                lambda: REGISTRY.get_sample_value("koordqos_proxy_open_connections") == 1,
                message="held connections released",
            )
            fresh = Channel(path=str(server.socket_path))
            try:
                assert await _answers(RuntimeHookServiceStub(fresh))  # room again
            finally:
                fresh.close()
        finally:
            for s in held:
                s.close()


async def test_disabled_stages_are_left_out_of_the_registration(short_dir: Path) -> None:
    """--runtime-hooks-disable-stages (koordlet's RuntimeHookDisableStages) narrows what the proxy calls."""
    async with running_agent(short_dir, hooks_extra={"disable_stages": "PreCreateContainer"}) as env:
        doc = json.loads((env.config_dir / "koordlet.json").read_text())
        assert doc["runtime-hooks"] == ["PreRunPodSandbox", "PreUpdateContainerResources"]


def test_registration_write_failure_is_counted_not_raised(short_dir: Path) -> None:
    blocker = short_dir / "not-a-dir"
    blocker.write_text("")
    reg = RegistrationFile(blocker / "hookserver.d", "{}\n")
    before = REGISTRY.get_sample_value("koordqos_proxy_registration_writes_total", {"outcome": "failed"}) or 0
    assert reg.sync() is False
    assert reg.sync() is False
    after = REGISTRY.get_sample_value("koordqos_proxy_registration_writes_total", {"outcome": "failed"})
    assert after == before + 2
    good = RegistrationFile(short_dir / "hookserver.d", "{}\n")
    assert good.sync() is True
    assert good.sync() is False  # unchanged: not rewritten
    assert (short_dir / "hookserver.d" / "koordlet.json").read_text() == "{}\n"


async def test_corked_transport_sends_one_loop_step_of_writes_together() -> None:
    loop = asyncio.get_running_loop()
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    corked = CorkedTransport(transport)  # type: ignore[arg-type]
    try:
        for part in (b"headers|", b"message|", b"trailers"):
            corked.write(part)
        corked.write(b"")
        with pytest.raises(BlockingIOError):
            peer.recv(1024)  # nothing sent yet: the writes wait for the end of this loop step
        step = loop.create_future()
        loop.call_soon(step.set_result, None)  # runs right after the flush scheduled by the first write
        await step
        assert peer.recv(1024) == b"headers|message|trailers"
        assert corked.get_extra_info("socket") is transport.get_extra_info("socket")  # delegated
        corked.write(b"last")
        corked.close()  # flushes before closing
        peer.setblocking(True)
        peer.settimeout(5)
        assert peer.recv(1024) == b"last"
    finally:
        transport.close()
        peer.close()


def test_uvloop_transports_are_corked_too() -> None:
    """uvloop's transports are not asyncio.Transport subclasses: corking must not depend on that class."""
    uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")

    async def wrapped_kind() -> tuple[bool, bool]:
        ours, peer = socket.socketpair()
        transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=ours)
        try:
            return isinstance(transport, asyncio.Transport), isinstance(corked(transport), CorkedTransport)
        finally:
            transport.close()
            peer.close()

    loop = uvloop.new_event_loop()
    try:
        is_asyncio_transport, was_corked = loop.run_until_complete(wrapped_kind())
    finally:
        loop.close()
    assert not is_asyncio_transport  # what made the isinstance check skip corking
    assert was_corked


# -- failures of our own and overruns ---------------------------------------------------------------------


def _container_req() -> rpb.ContainerResourceHookRequest:
    return rpb.ContainerResourceHookRequest(
        pod_meta=rpb.PodSandboxMetadata(uid="u1", name="p", namespace="ns"),
        container_resources=rpb.LinuxContainerResources(cpu_shares=5),
    )


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
async def test_an_internal_error_fails_the_call_only_under_fail(
    short_dir: Path, policy: FailurePolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(short_dir)
    server.service.policy = policy

    def broken(*args: object, **kw: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(server.service.converter, "container_context", broken)
    async with served(server) as stub:
        if policy == "Ignore":
            resp = await stub.PreCreateContainerHook(_container_req())
            assert resp is not None
            assert resp.container_resources.cpu_shares == 5  # the request's values, unchanged
        else:
            with pytest.raises(GRPCError) as err:
                await stub.PreCreateContainerHook(_container_req())
            assert err.value.status is Status.UNKNOWN
            assert "KeyError" in (err.value.message or "")


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
async def test_a_hook_overrunning_the_deadline(short_dir: Path, policy: FailurePolicy) -> None:
    server = make_server(short_dir)
    server.service.policy = policy
    server.service.request_timeout = 0.05  # the hooks get the 1 ms minimum
    released = asyncio.Event()

    async def slow(call: Call, stage: Stage, ctx: HookContext, state: object) -> None:
        await released.wait()  # never set: only the deadline ends this hook
        ctx.response.resources.cpu_shares = 999

    server.service.handler = slow
    async with served(server) as stub:
        if policy == "Ignore":
            resp = await stub.PreCreateContainerHook(_container_req())
            assert resp is not None
            assert resp.container_resources.cpu_shares == 5
        else:
            with pytest.raises(GRPCError) as err:
                await stub.PreCreateContainerHook(_container_req())
            assert err.value.status is Status.UNKNOWN
            assert "deadline" in (err.value.message or "")


async def test_a_long_lived_connection_remembers_a_bounded_number_of_closed_streams(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # h2 keeps 65,536 closed streams per connection (~135 bytes each): the fuzz run's one proxy connection
    # grew the agent's RSS by ~130 KiB per 1,000 requests until then
    made: list[Any] = []
    factory = _CorkedServer._protocol_factory

    def recording(self: _CorkedServer) -> Any:
        protocol = factory(self)
        made.append(protocol)
        return protocol

    monkeypatch.setattr(_CorkedServer, "_protocol_factory", recording)
    async with served(make_server(short_dir)) as stub:
        for _ in range(CLOSED_STREAMS_KEPT + 300):
            assert await _answers(stub)
        [protocol] = made
        h2 = protocol.connection._connection
        assert CLOSED_STREAMS_KEPT // 2 < len(h2._closed_streams) <= CLOSED_STREAMS_KEPT
        assert len(h2.streams) <= 2  # open ones are pruned as new streams arrive
        assert await _answers(stub)  # and the connection goes on serving
