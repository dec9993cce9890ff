"""The plugin against the mock runtime over a real unix socket: handshake, sync, events, replies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from koordqos.bus import EventBus
from koordqos.events.types import RuntimeContainerUpserted
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import (
    NRICreateContainer,
    NRIRemoveContainer,
    NRIRemovePodSandbox,
    NRIRunPodSandbox,
    NRIStartContainer,
    NRIStopContainer,
    NRIStopPodSandbox,
    NRISynchronize,
    NRIUpdateContainer,
)
from koordqos.nri.plugin import DEFAULT_EVENTS, NRINotConnectedError, NRIPlugin
from koordqos.testing.mock_nri.protocol import RuntimeCallError
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_node, sample_pod
from koordqos.testing.poll import wait_until

from .conftest import Handlers, settings


async def test_handshake_with_configure_before_register_reply(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    # the runtime answers RegisterPlugin only after Configure was answered: a plugin that waits for the
    # registration reply before serving conn 1 would never join
    async with MockRuntime(sock_path, hold_register_reply=True, request_timeout=1.0) as rt:
        plugin = start_plugin()
        link = await rt.wait_joined(timeout=5)
        assert (link.name, link.index, link.nri_version) == ("koordqos", "00", "v0.12.2")
        assert link.events == DEFAULT_EVENTS == 0x6CF
        assert not link.dropped.is_set()
        await plugin.wait_connected(2)
        assert plugin.status["nri"] == "connected"
        assert bus.state.nri_connected


async def test_old_runtime_gets_a_mask_it_knows(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin]
) -> None:
    async with MockRuntime(sock_path, nri_version="", dedicated_rpcs=False) as rt:
        start_plugin()
        link = await rt.wait_joined(timeout=5)
        assert link.events & ~0x7FF == 0
        assert link.events != 0


async def test_plugin_config_narrows_the_mask(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin]
) -> None:
    async with MockRuntime(sock_path, plugin_config="events: [RunPodSandbox, CreateContainer]") as rt:
        start_plugin()
        link = await rt.wait_joined(timeout=5)
        assert link.events == 0x1 | 0x8


async def test_bad_plugin_config_fails_configure(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin]
) -> None:
    async with MockRuntime(sock_path, plugin_config="events: [NoSuchEvent]") as rt:
        start_plugin()
        await wait_until(
            lambda: bool(rt.links) and rt.links[0].dropped.is_set(),
            timeout=5,
            message="the runtime to drop the plugin",
        )
        assert "NoSuchEvent" in rt.links[0].drop_reason


async def test_bad_name_is_rejected_and_retried(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin]
) -> None:
    async with MockRuntime(sock_path) as rt:
        # bypass config validation: the runtime is the one that checks (v0.12 charset)
        nri = settings(sock_path).model_copy(update={"plugin_name": "bad name"})
        plugin = start_plugin(nri)
        await wait_until(lambda: len(rt.links) >= 2, timeout=5, message="a second plugin connection")
        assert "invalid plugin name" in rt.links[0].register_rejected
        assert rt.links[0].dropped.is_set()  # the plugin closed the abandoned socket itself
        assert not plugin.connected


async def test_synchronize_200_pods_400_containers_in_chunks(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus, handlers: Handlers
) -> None:
    seen: list[NRISynchronize] = []
    sizes: list[tuple[int, int]] = []

    def hook(ev: NRISynchronize, state: Any) -> None:
        seen.append(ev)
        sizes.append((len(ev.pods), len(ev.containers)))  # during the call: its lists go after the reply
        for ctr in ev.containers[:3]:
            ev.update_for(ctr.id).linux.resources.cpu.shares.value = 2
        ev.update_for("untouched")  # left empty: must not reach the runtime

    handlers.on(NRISynchronize, hook)
    rt = MockRuntime(sock_path, sync_chunk=50)
    rt.pods, rt.containers = sample_node(200, 2)
    async with rt:
        start_plugin()
        link = await rt.wait_joined(timeout=10)
    assert link.sync_chunks == 8
    assert [r.more for r in link.sync_replies] == [True] * 7 + [False]
    assert all(not r.update for r in link.sync_replies[:-1])
    assert [u.container_id for u in link.sync_updates] == [c.id for c in rt.containers[:3]]
    assert len(seen) == 1
    assert sizes == [(200, 400)]
    assert not seen[0].reconnect
    # the sync's thousands of messages are released in slices after the reply (not all in one loop step
    # when the handler returns): an event kept past its call is empty
    assert (seen[0].pods, seen[0].containers, seen[0].updates) == ([], [], [])
    assert len(bus.state.sandboxes) == 200
    assert len(bus.state.containers) == 400
    ctr = bus.state.containers[rt.containers[5].id]
    assert ctr.pod_uid == rt.pods[2].uid
    assert ctr.state == "running"


async def test_synchronize_larger_than_4mib_is_chunked(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    rt = MockRuntime(sock_path, request_timeout=5.0)
    rt.pods, rt.containers = sample_node(10, 6)
    for ctr in rt.containers:
        ctr.annotations["big"] = "x" * 100_000  # 60 × 100 kB ≈ 6 MB in all
    async with rt:
        start_plugin()
        link = await rt.wait_joined(timeout=10)
    assert link.sync_chunks >= 2
    assert len(bus.state.containers) == 60


async def test_no_hooks_give_empty_replies(sock_path: Path, start_plugin: Callable[..., NRIPlugin]) -> None:
    rt = MockRuntime(sock_path)
    rt.pods, rt.containers = sample_node(2, 1)
    async with rt:
        start_plugin()
        await rt.wait_joined(timeout=5)
        pod = sample_pod(9)
        ctr = sample_container(pod, 0)
        created = await rt.create_container(pod, ctr)
        assert created is not None
        assert created.ByteSize() == 0
        updated = await rt.update_container(pod, ctr, ctr.linux.resources)
        assert updated is not None
        assert updated.ByteSize() == 0
        stopped = await rt.stop_container(pod, ctr)
        assert stopped is not None
        assert stopped.ByteSize() == 0


@pytest.mark.parametrize("dedicated", [True, False], ids=["dedicated-rpcs", "state-change"])
async def test_every_lifecycle_event(
    sock_path: Path,
    start_plugin: Callable[..., NRIPlugin],
    bus: EventBus,
    dedicated: bool,
    handlers: Handlers,
) -> None:
    got: list[tuple[str, str]] = []

    def record(ev: Any, state: Any) -> None:
        ident = ev.container.id if hasattr(ev, "container") else ev.pod.id
        got.append((type(ev).__name__, ident))
        if isinstance(ev, NRIRunPodSandbox):
            assert ev.pod.id in state.sandboxes  # state is published before the request
        if isinstance(ev, NRIRemoveContainer):
            assert ev.container.id in state.containers  # removal happens after the hooks ran
        if isinstance(ev, NRIUpdateContainer):
            assert ev.linux_resources.cpu.shares.value == 1024
            ev.update_for(ev.container.id).linux.resources.cpu.shares.value = 512

    for cls in (
        NRIRunPodSandbox,
        NRIStopPodSandbox,
        NRIRemovePodSandbox,
        NRICreateContainer,
        NRIStartContainer,
        NRIUpdateContainer,
        NRIStopContainer,
        NRIRemoveContainer,
    ):
        handlers.on(cls, record)
    async with MockRuntime(sock_path, dedicated_rpcs=dedicated) as rt:
        start_plugin()
        await rt.wait_joined(timeout=5)
        pod = sample_pod(1)
        ctr = sample_container(pod, 0, state=api.CONTAINER_CREATED)
        await rt.run_pod_sandbox(pod)
        await rt.create_container(pod, ctr)
        await rt.start_container(pod, ctr)
        res = api.LinuxResources()
        res.cpu.shares.value = 1024
        upd = await rt.update_container(pod, ctr, res)
        assert upd is not None
        assert [u.container_id for u in upd.update] == [ctr.id]
        assert upd.update[0].linux.resources.cpu.shares.value == 512
        await rt.stop_container(pod, ctr)
        assert bus.state.containers[ctr.id].state == "stopped"
        await rt.remove_container(pod, ctr)
        assert ctr.id not in bus.state.containers
        await rt.stop_pod_sandbox(pod)
        await rt.remove_pod_sandbox(pod)
        assert pod.id not in bus.state.sandboxes
        methods = [m for m, _ in rt.calls]
    assert got == [
        ("NRIRunPodSandbox", pod.id),
        ("NRICreateContainer", ctr.id),
        ("NRIStartContainer", ctr.id),
        ("NRIUpdateContainer", ctr.id),
        ("NRIStopContainer", ctr.id),
        ("NRIRemoveContainer", ctr.id),
        ("NRIStopPodSandbox", pod.id),
        ("NRIRemovePodSandbox", pod.id),
    ]
    via_state_change = [m for m in methods if m.startswith("StateChange:")]
    if dedicated:
        assert not via_state_change
    else:
        assert via_state_change == [
            "StateChange:RunPodSandbox",
            "StateChange:PostStartContainer",
            "StateChange:RemoveContainer",
            "StateChange:StopPodSandbox",
            "StateChange:RemovePodSandbox",
        ]


async def test_container_state_events_follow_the_lifecycle(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    states: list[str] = []
    bus.subscribe("states", lambda ev, st: states.append(ev.container.state), RuntimeContainerUpserted)
    bus_task = asyncio.create_task(bus.run())
    try:
        async with MockRuntime(sock_path) as rt:
            start_plugin()
            await rt.wait_joined(timeout=5)
            pod = sample_pod(1)
            ctr = sample_container(pod, 0, state=api.CONTAINER_UNKNOWN)
            await rt.create_container(pod, ctr)
            await rt.start_container(pod, ctr)
            await rt.stop_container(pod, ctr)
            await bus.drained()
    finally:
        bus_task.cancel()
        await asyncio.gather(bus_task, return_exceptions=True)
    assert states == ["created", "running", "stopped"]


async def test_update_container_records_the_requested_resources(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    bus_task = asyncio.create_task(bus.run())
    try:
        async with MockRuntime(sock_path) as rt:
            start_plugin()
            await rt.wait_joined(timeout=5)
            pod = sample_pod(1)
            ctr = sample_container(pod, 0)
            await rt.create_container(pod, ctr)
            res = api.LinuxResources()
            res.CopyFrom(ctr.linux.resources)
            res.cpu.quota.value = 150000
            res.memory.limit.value = 1 << 30
            await rt.update_container(pod, ctr, res)
            await bus.drained()
    finally:
        bus_task.cancel()
        await asyncio.gather(bus_task, return_exceptions=True)
    recorded = bus.state.containers[ctr.id]
    assert (recorded.cpu_quota, recorded.memory_limit) == (150000, 1 << 30)


async def test_unknown_methods_get_unimplemented(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin]
) -> None:
    async with MockRuntime(sock_path) as rt:
        start_plugin()
        await rt.wait_joined(timeout=5)
        resp = await rt.call_raw("NoSuchMethod")
        assert (resp.status.code, resp.status.message) == (12, "method NoSuchMethod")
        resp = await rt.call_raw("Configure", service="some.other.Service")
        assert (resp.status.code, resp.status.message) == (12, "service some.other.Service")
        # the plugin stays connected and keeps answering
        assert await rt.create_container(sample_pod(1), sample_container(sample_pod(1), 0)) is not None
        assert not rt.links[0].dropped.is_set()


async def test_a_reply_over_4_mib_becomes_resource_exhausted(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus, handlers: Handlers
) -> None:
    calls = 0

    def huge_once(ev: NRICreateContainer, state: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            ev.adjust.annotations["example.com/huge"] = "v" * (5 << 20)

    handlers.on(NRICreateContainer, huge_once)
    async with MockRuntime(sock_path) as rt:
        start_plugin()
        await rt.wait_joined(timeout=5)
        pod = sample_pod(1)
        with pytest.raises(RuntimeCallError, match="exceeds") as err:
            await rt.create_container(pod, sample_container(pod, 0))
        assert err.value.code == 8  # RESOURCE_EXHAUSTED: the operation fails, the plugin is not dropped
        assert not rt.links[0].dropped.is_set()
        assert await rt.create_container(pod, sample_container(pod, 1)) is not None


async def test_replies_larger_than_4096_bytes(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus, handlers: Handlers
) -> None:
    def big(ev: NRICreateContainer, state: Any) -> None:
        for i in range(50):
            ev.adjust.annotations[f"example.com/k{i}"] = "v" * 200  # ≈ 11 kB reply
        ev.adjust.linux.resources.cpu.shares.value = 2

    handlers.on(NRICreateContainer, big)
    async with MockRuntime(sock_path) as rt:
        plugin = start_plugin()
        await rt.wait_joined(timeout=5)
        pod = sample_pod(1)
        resp = await rt.create_container(pod, sample_container(pod, 0))
        assert resp is not None
        assert resp.ByteSize() > 10_000
        assert len(resp.adjust.annotations) == 50
        assert resp.adjust.linux.resources.cpu.shares.value == 2
        # unsolicited UpdateContainers above 4096 bytes too, two at once answered out of order
        first_in = asyncio.Event()
        release = asyncio.Event()

        async def handler(req: api.UpdateContainersRequest) -> list[api.ContainerUpdate]:
            if req.update[0].container_id == "a":
                first_in.set()
                await release.wait()
                return []
            release.set()
            return [req.update[0]]

        rt.update_handler = handler
        updates_a = [api.ContainerUpdate(container_id="a")]
        updates_a[0].linux.resources.unified.update({f"k{i}": "x" * 100 for i in range(60)})
        fa = asyncio.create_task(plugin.update_containers(updates_a))
        await first_in.wait()
        failed_b = await plugin.update_containers([api.ContainerUpdate(container_id="b")])
        failed_a = await fa
        assert [u.container_id for u in failed_b] == ["b"]
        assert failed_a == []
        assert not rt.links[0].dropped.is_set()
        assert rt.links[0].update_requests[0].ByteSize() > 4096


async def test_create_container_never_updates_itself(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus, handlers: Handlers
) -> None:
    def hook(ev: NRICreateContainer, state: Any) -> None:
        ev.update_for(ev.container.id).linux.resources.cpu.shares.value = 5
        ev.update_for("other").linux.resources.cpu.shares.value = 6

    handlers.on(NRICreateContainer, hook)
    async with MockRuntime(sock_path) as rt:
        start_plugin()
        await rt.wait_joined(timeout=5)
        pod = sample_pod(1)
        resp = await rt.create_container(pod, sample_container(pod, 0))
        assert resp is not None
        assert [u.container_id for u in resp.update] == ["other"]


async def test_failure_policy(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus, handlers: Handlers
) -> None:
    def broken(ev: NRICreateContainer, state: Any) -> None:
        ev.adjust.annotations["partial"] = "yes"
        raise ValueError("boom")

    handlers.on(NRICreateContainer, broken)
    async with MockRuntime(sock_path) as rt:
        plugin = start_plugin()
        await rt.wait_joined(timeout=5)
        pod = sample_pod(1)
        resp = await rt.create_container(pod, sample_container(pod, 0))
        assert resp is not None  # Ignore: a success, the container is created
        plugin.failure_policy = "Fail"
        with pytest.raises(RuntimeCallError, match="boom") as err:
            await rt.create_container(pod, sample_container(pod, 1))
        assert err.value.code == 2
        assert not rt.links[0].dropped.is_set()  # an error status is not fatal


async def test_a_failing_synchronize_hook_never_keeps_nri_down_under_fail(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus, handlers: Handlers
) -> None:
    """An error reply to Synchronize makes the runtime close the plugin, and it would fail the same way on
    every reconnect: Synchronize always runs its hooks under Ignore."""

    def broken(ev: NRISynchronize, state: Any) -> None:
        raise ValueError("boom")

    handlers.on(NRISynchronize, broken)
    async with MockRuntime(sock_path) as rt:
        rt.pods, rt.containers = sample_node(3, 2)
        plugin = start_plugin(failure_policy="Fail")
        link = await rt.wait_joined(timeout=5)
        assert not link.dropped.is_set()
        await plugin.wait_connected(5)
        assert len(rt.links) == 1  # joined once, no reconnect loop


def test_disabled_stages_leave_the_nri_subscription() -> None:
    from koordqos.nri.plugin import DEFAULT_EVENTS, event_bit, mask_without_stages

    mask = mask_without_stages(DEFAULT_EVENTS, ["PreCreateContainer", "PostStopContainer"])
    assert not mask & event_bit(api.CREATE_CONTAINER)
    assert mask & event_bit(api.RUN_POD_SANDBOX)
    assert mask & event_bit(api.STOP_CONTAINER)  # no NRI event carries PostStopContainer's hooks alone
    assert mask_without_stages(DEFAULT_EVENTS, []) == DEFAULT_EVENTS


async def test_update_containers_needs_a_connection(bus: EventBus, sock_path: Path) -> None:
    plugin = NRIPlugin(bus, settings(sock_path))
    with pytest.raises(NRINotConnectedError):
        await plugin.update_containers([api.ContainerUpdate(container_id="x")])


async def test_container_records_go_to_node_state_after_the_reply_and_before_the_next_request(
    tmp_path: Path, bus: EventBus
) -> None:
    """A container call answered at once writes its reply first; its record is in NodeState before the next
    request (even one that arrived in the same read) is handled, in the order the calls came."""
    from koordqos.config import NRISettings
    from koordqos.nri.connection import NRIConnection
    from koordqos.nri.mux import frames_for
    from koordqos.nri.session import PLUGIN_SERVICE, PluginSession
    from koordqos.nri.ttrpc import MessageType, encode_message, encode_request

    seen_at_write: list[set[str]] = []

    class Sink:
        def writelines(self, frames: object) -> None:
            seen_at_write.append(set(bus.state.containers))

        def is_closing(self) -> bool:
            return False

    seen_by_handler: list[set[str]] = []

    def handler(ev: Any, state: Any, call: Any) -> None:
        seen_by_handler.append(set(state.containers))

    plugin = NRIPlugin(bus, NRISettings(socket=tmp_path / "s"), handler=handler)
    session = PluginSession(plugin)
    conn = NRIConnection(session.handle)
    conn._transport = Sink()  # type: ignore[assignment]
    pod = sample_pod(1)
    a, b = sample_container(pod, 0, api.CONTAINER_CREATED), sample_container(pod, 1, api.CONTAINER_CREATED)

    def request(stream: int, method: str, payload: bytes) -> bytes:
        env = encode_request(PLUGIN_SERVICE, method, payload, 2_000_000_000)
        return b"".join(frames_for(1, encode_message(stream, MessageType.REQUEST, env)))

    create_a = api.CreateContainerRequest(pod=pod, container=a).SerializeToString()
    create_b = api.CreateContainerRequest(pod=pod, container=b).SerializeToString()
    remove_a = api.RemoveContainerRequest(pod=pod, container=a).SerializeToString()
    # three requests in one read: create a, create b, remove a
    conn.data_received(
        request(1, "CreateContainer", create_a)
        + request(3, "CreateContainer", create_b)
        + request(5, "RemoveContainer", remove_a)
    )
    assert seen_at_write == [set(), {a.id}, {a.id, b.id}]  # each reply before its own record
    assert seen_by_handler == [set(), {a.id}, {a.id, b.id}]
    assert set(bus.state.containers) == {b.id}  # the removal came last and stays last
    assert bus.state.containers[b.id].state == "created"


async def test_a_container_reported_again_unchanged_publishes_nothing(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    """The runtime repeating a container's record (same state, resources, pid) changes nothing in NodeState:
    no event is published for it (the state's generation stays), so nothing downstream wakes; a change is."""
    async with MockRuntime(sock_path) as rt:
        start_plugin()
        await rt.wait_joined(timeout=5)
        pod = sample_pod(1)
        ctr = sample_container(pod, 0, state=api.CONTAINER_CREATED)
        await rt.run_pod_sandbox(pod)
        await rt.create_container(pod, ctr)
        generation = bus.state.generation
        first = bus.state.containers[ctr.id]
        await rt.create_container(pod, ctr)  # the same container, the same record
        assert bus.state.generation == generation
        assert bus.state.containers[ctr.id] is first
        ctr.linux.resources.cpu.shares.value = first.cpu_shares + 1
        await rt.create_container(pod, ctr)  # its resources changed
        assert bus.state.generation == generation + 1
        assert bus.state.containers[ctr.id].cpu_shares == first.cpu_shares + 1
        await rt.stop_container(pod, ctr)  # its state changed
        assert bus.state.generation == generation + 2
        assert bus.state.containers[ctr.id].state == "stopped"
