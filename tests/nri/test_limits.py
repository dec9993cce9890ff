"""A runtime that reports new pod sandboxes and containers forever cannot grow NodeState past the limits:
new ids past them are answered but not kept (counted, logged once); tracked ids still update and go."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from structlog.testing import capture_logs

from koordqos.bus import EventBus
from koordqos.nri.calls import NRICreateContainer, NRIRunPodSandbox
from koordqos.nri.plugin import NRIPlugin
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_node, sample_pod

from .conftest import Handlers, metric, settings

UNTRACKED = "koordqos_nri_untracked_objects_total"
WARNING = "NRI runtime reports more objects than the agent tracks; new ones are answered, not kept"


async def test_new_sandboxes_and_containers_past_the_limits_are_answered_not_kept(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus, handlers: Handlers
) -> None:
    served: list[str] = []
    handlers.on(NRIRunPodSandbox, lambda ev, state: served.append(ev.pod.id))

    def adjust(ev: NRICreateContainer, state: object) -> None:
        ev.adjust.linux.resources.cpu.shares.value = 2

    handlers.on(NRICreateContainer, adjust)
    before = (metric(UNTRACKED, kind="sandbox"), metric(UNTRACKED, kind="container"))
    pods = [sample_pod(i) for i in range(5)]
    async with MockRuntime(sock_path) as rt:
        start_plugin(settings(sock_path, max_pod_sandboxes=3, max_containers=4))
        await rt.wait_joined(timeout=10)
        with capture_logs() as logs:
            for pod in pods:
                await rt.run_pod_sandbox(pod)
            answers = [await rt.create_container(pods[0], sample_container(pods[0], j)) for j in range(6)]
            await rt.run_pod_sandbox(pods[0])  # a tracked id: updated as usual, no refusal
        assert served == [p.id for p in pods] + [pods[0].id]  # every call reached the hooks
        assert all(a is not None and a.adjust.linux.resources.cpu.shares.value == 2 for a in answers)
        assert sorted(bus.state.sandboxes) == sorted(p.id for p in pods[:3])
        assert len(bus.state.containers) == 4
        assert metric(UNTRACKED, kind="sandbox") == before[0] + 2
        assert metric(UNTRACKED, kind="container") == before[1] + 2
        warned = [e for e in logs if e["event"] == WARNING]
        assert [(e["kind"], e["limit"]) for e in warned] == [("sandbox", 3), ("container", 4)]  # once each
        # a removal makes room again
        await rt.remove_pod_sandbox(pods[1])
        await rt.run_pod_sandbox(pods[4])
        assert pods[4].id in bus.state.sandboxes
        assert pods[1].id not in bus.state.sandboxes


async def test_a_synchronize_past_the_limits_is_kept_up_to_them(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    before = (metric(UNTRACKED, kind="sandbox"), metric(UNTRACKED, kind="container"))
    rt = MockRuntime(sock_path, sync_chunk=7)  # the chunks are collected capped, not only the union
    rt.pods, rt.containers = sample_node(30, 2)
    async with rt:
        start_plugin(settings(sock_path, max_pod_sandboxes=10, max_containers=25))
        link = await rt.wait_joined(timeout=10)
        assert link.sync_chunks > 1
        assert len(bus.state.sandboxes) == 10
        assert len(bus.state.containers) == 25
        assert metric(UNTRACKED, kind="sandbox") == before[0] + 20
        assert metric(UNTRACKED, kind="container") == before[1] + 35
        assert bus.state.nri_connected  # the runtime got its answer: the plugin is in service


def test_the_defaults_are_far_above_a_real_node() -> None:
    nri = settings(Path("/tmp/x.sock"))
    assert nri.max_pod_sandboxes >= 4 * 250  # kubelet allows 110 pods by default, large nodes 250
    assert nri.max_containers >= 8 * nri.max_pod_sandboxes
