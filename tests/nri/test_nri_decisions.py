"""NRI decisions are logged like every other one (issue #32 item 5h): the "NRI synchronized" line counts the
runtime's pods and containers; a reply that changes a container's values is a decision `{old, new}` logged
at info (a repeat of the one last logged for that container is recorded, not logged again); a reply that
changes nothing is no decision; unsolicited updates are decisions, and in dry-run nothing is sent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from koordqos.bus import EventBus
from koordqos.decisions import DecisionLog
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import NRICreateContainer, NRISynchronize, NRIUpdateContainer
from koordqos.nri.plugin import NRIPlugin
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_pod

from .test_convert import be_pod, ctr, nh, serve


def decision_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == "decision" and e.get("log_level") == "info"]


async def test_synchronized_line_counts_the_runtime_s_pods_and_containers(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin]
) -> None:
    async with MockRuntime(sock_path) as rt:
        pods = [sample_pod(i) for i in range(3)]
        rt.pods = pods
        rt.containers = [sample_container(p, j) for p in pods for j in range(2)]
        with capture_logs() as logs:
            start_plugin()
            await rt.wait_joined(timeout=10)
    synced = [e for e in logs if e.get("event") == "NRI synchronized"]
    assert [(e["pods"], e["containers"]) for e in synced] == [(3, 6)]  # (0, 0) before


async def test_a_create_container_adjustment_is_a_logged_decision_with_old_and_new(tmp_path: Path) -> None:
    h = nh(tmp_path)
    with capture_logs() as logs:
        await serve(h, NRICreateContainer(be_pod(), ctr(api.CONTAINER_CREATED)))
    lines = decision_lines(logs)
    assert len(lines) == 1, logs
    line = lines[0]
    assert (line["action"], line["target"], line["reason"]) == ("nri-adjust", "ns/p/c", "CreateContainer")
    # the container asked for nothing: its values before the adjustment
    assert "quota=50000" in line["new"]
    assert "quota=-1" in line["old"]
    last = h.core.decisions.recent()[-1]
    assert (last.old, last.new) == (line["old"], line["new"])


async def test_a_repeated_decision_is_recorded_but_not_logged_again(tmp_path: Path) -> None:
    h = nh(tmp_path)
    before = len(h.core.decisions)
    with capture_logs() as logs:
        for _ in range(3):
            await serve(h, NRIUpdateContainer(be_pod(), ctr()))
    assert len(h.core.decisions) == before + 3  # every reply recorded (and counted)
    assert len(decision_lines(logs)) == 1


async def test_a_reply_that_changes_nothing_is_no_decision(tmp_path: Path) -> None:
    h = nh(tmp_path)
    ev = NRICreateContainer(be_pod(), ctr(api.CONTAINER_CREATED))
    await serve(h, ev)
    # the same container again, now asking for exactly what the hooks set
    fine = ctr(api.CONTAINER_CREATED)
    fine.linux.resources.CopyFrom(ev.adjust.linux.resources)
    before = len(h.core.decisions)
    with capture_logs() as logs:
        again = NRICreateContainer(be_pod(), fine)
        await serve(h, again)
    assert again.adjust.linux.resources.cpu.quota.value == 50000  # the reply itself is unchanged
    assert len(h.core.decisions) == before
    assert decision_lines(logs) == []


async def test_a_synchronize_update_records_the_values_it_replaces(tmp_path: Path) -> None:
    h = nh(tmp_path)
    c = ctr()
    c.linux.resources.cpu.shares.value = 2
    with capture_logs() as logs:
        await serve(h, NRISynchronize([be_pod()], [c]))
    (line,) = decision_lines(logs)
    assert (line["action"], line["reason"]) == ("nri-update", "Synchronize")
    assert "shares=512" in line["new"]
    assert "shares=2" in line["old"]


async def test_unsolicited_updates_are_decisions_and_dry_run_sends_none(
    sock_path: Path, start_plugin: Callable[..., NRIPlugin], bus: EventBus
) -> None:
    decisions = DecisionLog()
    async with MockRuntime(sock_path) as rt:
        plugin = start_plugin(decisions=decisions)
        await rt.wait_joined(timeout=10)
        update = api.ContainerUpdate(container_id="c1")
        update.linux.resources.cpu.shares.value = 7
        with capture_logs() as logs:
            assert await plugin.update_containers([update]) == []
        (line,) = decision_lines(logs)
        assert (line["action"], line["new"], line["reason"]) == ("nri-update", "shares=7", "UpdateContainers")
        assert line["target"] == "container c1"  # not in NodeState: named by its id
        assert len(rt.links[0].update_requests) == 1
        decisions.dry_run = True
        assert await plugin.update_containers([update]) == []
        assert len(rt.links[0].update_requests) == 1  # nothing sent
        assert decisions.recent()[-1].dry_run


async def test_a_repeated_dry_run_decision_is_recorded_once(tmp_path: Path) -> None:
    """issue #32 item 5g: nothing is sent in dry-run, so the runtime asks again with the same values (a
    reconnect's Synchronize, the next UpdateContainer); a real run's reply would have changed them and the
    repeat would be no decision: a dry-run records it once."""
    h = nh(tmp_path, dry_run=True)
    before = len(h.core.decisions)
    for _ in range(3):
        ev = NRIUpdateContainer(be_pod(), ctr())
        await serve(h, ev)
        assert ev.updates == []  # the runtime gets nothing
    assert len(h.core.decisions) == before + 1
    (d,) = h.core.decisions.recent()[before:]
    assert (d.action, d.dry_run) == ("nri-update", True)
