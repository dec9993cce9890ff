"""Reflector vs the fake API server: sync, updates, outages, 410, silent connections, restarts, NodeSLO."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.events.types import NodeSLOUpdated, NodeUpdated, PodsReplaced
from koordqos.kube import KubeConnection
from koordqos.kube.eventrecorder import EventRecorder
from koordqos.kube.reflector import Reflector, ReflectorSettings
from koordqos.kube.sources import NODES_PATH, NODESLOS_PATH, PODS_PATH, NodeSLOSource, NodeSource, PodSource
from koordqos.model.nodeslo import default_nodeslo
from koordqos.model.qos import QoSClass
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo, make_pod

from .conftest import NODE, Recorder, watches_open


class Sources:
    """The three reflectors of cluster mode, running as tasks."""

    def __init__(self, bus: EventBus, conn: KubeConnection, settings: ReflectorSettings) -> None:
        self.bus = bus
        self.recorder = EventRecorder(conn.get, NODE)
        self.nodeslo = NodeSLOSource(bus, NODE, self.recorder)
        self.pods = Reflector(
            "pods", conn.get, PODS_PATH, PodSource(bus, NODE), f"spec.nodeName={NODE}", settings
        )
        self.node = Reflector(
            "node", conn.get, NODES_PATH, NodeSource(bus, NODE), f"metadata.name={NODE}", settings
        )
        self.slo = Reflector(
            "nodeslo", conn.get, NODESLOS_PATH, self.nodeslo, f"metadata.name={NODE}", settings
        )
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(r.run()) for r in (self.pods, self.node, self.slo)]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def pod_names(self) -> set[str]:
        return {p.name for p in self.bus.state.pods.values()}

    async def synced(self) -> None:
        await wait_until(
            lambda: {"pods", "node", "nodeslo"} <= self.bus.state.synced, message="all sources synced"
        )


@asynccontextmanager
async def running(bus: EventBus, conn: KubeConnection, settings: ReflectorSettings) -> AsyncIterator[Sources]:
    s = Sources(bus, conn, settings)
    s.start()
    try:
        yield s
    finally:
        await s.stop()


def seed(fake: FakeAPIServer, pods: int = 10) -> None:
    fake.upsert("nodes", make_node(NODE, cpu="8", memory="16Gi"))
    fake.upsert("nodes", make_node("node-b"))
    for i in range(pods):
        fake.upsert("pods", make_pod(f"p{i}", NODE, qos="BE" if i % 2 else "LS"))
    for i in range(3):
        fake.upsert("pods", make_pod(f"other{i}", "node-b"))
    fake.upsert(
        "nodeslos",
        make_nodeslo(
            NODE, {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 70}}
        ),
    )


def threshold(bus: EventBus) -> int | None:
    slo = bus.state.node_slo
    assert slo is not None
    assert slo.resource_used_threshold_with_be is not None
    return slo.resource_used_threshold_with_be.cpu_suppress_threshold_percent


async def test_initial_sync_lists_pods_of_this_node_node_and_nodeslo(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings, recorder: Recorder
) -> None:
    seed(fake, pods=10)
    async with running(bus, conn, fast) as s:
        await s.synced()
        assert s.pod_names() == {f"p{i}" for i in range(10)}
        state = bus.state
        assert state.node is not None
        assert state.node.capacity["cpu"] == 8000
        assert state.node.capacity["memory"] == 16 * 1024**3
        assert threshold(bus) == 70
        assert state.pod_by_name("default", "p1") is not None
        assert state.pod_by_name("default", "p1").qos is QoSClass.BE  # type: ignore[union-attr]
        # page size 7 → the 10 pods came in two pages
        pages = fake.count_requests(lambda m, p, q: p == PODS_PATH and "watch" not in q)
        assert pages == 2
        assert all(
            q.get("fieldSelector") == f"spec.nodeName={NODE}" for m, p, q in fake.requests if p == PODS_PATH
        )
        await bus.drained()
        assert len(recorder.of(PodsReplaced)) == 1


async def test_updates_flow_as_events(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings, recorder: Recorder
) -> None:
    seed(fake, pods=2)
    async with running(bus, conn, fast) as s:
        await s.synced()
        fake.upsert("pods", make_pod("new", NODE, qos="LSR"))
        await wait_until(lambda: "new" in s.pod_names(), message="new pod")
        fake.upsert("pods", make_pod("new", NODE, qos="BE"))
        await wait_until(
            lambda: bus.state.pod_by_name("default", "new").qos is QoSClass.BE,  # type: ignore[union-attr]
            message="pod relabelled",
        )
        fake.delete("pods", "p0")
        await wait_until(lambda: "p0" not in s.pod_names(), message="pod deleted")
        fake.upsert("nodes", make_node(NODE, cpu="16"))
        await wait_until(
            lambda: bus.state.node is not None and bus.state.node.capacity["cpu"] == 16000,
            message="node update",
        )
        fake.upsert(
            "nodeslos",
            make_nodeslo(NODE, {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 55}}),
        )
        await wait_until(lambda: threshold(bus) == 55, message="NodeSLO update")
        # unchanged resubmission of the node is not republished
        await bus.drained()
        nodes_before = len(recorder.of(NodeUpdated))
        node = fake.get("nodes", NODE)
        assert node is not None
        fake.upsert("nodes", node)
        fake.upsert("pods", make_pod("marker", NODE))
        await wait_until(lambda: "marker" in s.pod_names(), message="marker pod")
        await bus.drained()
        assert len(recorder.of(NodeUpdated)) == nodes_before
        assert s.pods.lists == 1  # everything came through the watch


async def test_pod_deleted_during_outage_is_seen_after_relist(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    seed(fake, pods=5)
    async with running(bus, conn, fast) as s:
        await s.synced()
        await fake.stop()
        fake.delete("pods", "p3")
        fake.upsert("pods", make_pod("born-while-away", NODE))
        fake.compact()  # etcd compaction: the watch cannot resume, a re-list is needed
        await fake.start()
        await wait_until(
            lambda: "p3" not in s.pod_names() and "born-while-away" in s.pod_names(),
            message="re-list after the outage",
        )
        assert s.pods.lists >= 2
        assert s.pods.watch_ends.get("expired", 0) >= 1


async def test_410_gone_recovers_by_relisting(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    seed(fake, pods=3)
    async with running(bus, conn, fast) as s:
        await s.synced()
        await watches_open(fake, "pods")
        fake.stall_watches()  # the deletion below is never delivered on the open watch
        fake.delete("pods", "p0")
        fake.compact()
        fake.drop_watches()  # the reconnect asks for a compacted version → ERROR 410
        await wait_until(lambda: s.pods.watch_ends.get("expired", 0) >= 1, message="410 seen")
        await wait_until(lambda: "p0" not in s.pod_names(), message="deleted pod gone after re-list")
        fake.upsert("pods", make_pod("after", NODE))
        await wait_until(lambda: "after" in s.pod_names(), message="watch resumed after re-list")


async def test_silent_connection_is_detected_by_the_read_timeout(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    fast.read_timeout_seconds = 0.3
    seed(fake, pods=2)
    async with running(bus, conn, fast) as s:
        await s.synced()
        await watches_open(fake, "pods")
        fake.stall_watches()  # connections stay open but deliver nothing
        fake.upsert("pods", make_pod("during-stall", NODE))
        await wait_until(lambda: "during-stall" in s.pod_names(), message="event after reconnect")
        assert s.pods.watch_ends.get("silent", 0) >= 1
        assert s.pods.lists == 1  # resumed from the resourceVersion, no re-list


async def test_bookmarks_advance_the_resource_version(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    seed(fake, pods=1)
    async with running(bus, conn, fast) as s:
        await s.synced()
        await watches_open(fake, "pods")
        fake.upsert("pods", make_pod("elsewhere", "node-b"))  # filtered out: our watch sees nothing
        fake.send_bookmark()
        await wait_until(lambda: s.pods.resource_version == str(fake.rv), message="bookmark applied")
        assert "elsewhere" not in s.pod_names()


async def test_api_server_restart_resumes_the_watch(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    seed(fake, pods=2)
    async with running(bus, conn, fast) as s:
        await s.synced()
        await fake.stop()
        fake.upsert("pods", make_pod("while-down", NODE))
        fake.delete("pods", "p1")
        await fake.start()
        await wait_until(
            lambda: "while-down" in s.pod_names() and "p1" not in s.pod_names(),
            message="changes made while the server was down",
        )
        fake.upsert("pods", make_pod("after-restart", NODE))
        await wait_until(lambda: "after-restart" in s.pod_names(), message="live events after restart")
        assert s.pods.lists == 1  # history survived: resumed from the resourceVersion


async def test_errors_back_off_and_recover(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    seed(fake, pods=2)
    fake.fail_next(PODS_PATH, status=500, times=3)
    async with running(bus, conn, fast) as s:
        await s.synced()
        assert s.pods.watch_ends.get("api") == 3
        assert s.pods.backoff.failures == 0  # reset by the successful list
        assert s.pod_names() == {"p0", "p1"}


async def test_invalid_nodeslo_field_keeps_its_last_valid_value_and_the_rest_applies(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings, recorder: Recorder
) -> None:
    seed(fake, pods=1)
    counter = "koordqos_nodeslo_invalid_fields_total"
    before = obs.REGISTRY.get_sample_value(counter, {"source": "api"}) or 0.0
    async with running(bus, conn, fast) as s:
        await s.synced()
        assert threshold(bus) == 70
        fake.upsert(
            "nodeslos",
            make_nodeslo(NODE, {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": "lots"}}),
        )
        await wait_until(lambda: "lots" in s.nodeslo.last_error, message="invalid NodeSLO field seen")
        assert "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent" in s.nodeslo.last_error
        await wait_until(
            lambda: any(e["reason"] == "InvalidNodeSLO" for e in fake.events), message="Warning event"
        )
        event = next(e for e in fake.events if e["reason"] == "InvalidNodeSLO")
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "NodeSLO"
        assert event["involvedObject"]["name"] == NODE
        await wait_until(lambda: _enabled(bus) is False, message="the rest of the object applied")
        assert threshold(bus) == 70  # the invalid field: its last valid value
        after = obs.REGISTRY.get_sample_value(counter, {"source": "api"})
        assert after == before + 1
        assert s.nodeslo.invalid_count == 0  # the object was a NodeSLO: not rejected whole
        fake.upsert(
            "nodeslos",
            make_nodeslo(NODE, {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 60}}),
        )
        await wait_until(lambda: threshold(bus) == 60, message="next valid NodeSLO applied")
        await bus.drained()
        assert [threshold_of(e) for e in recorder.of(NodeSLOUpdated)] == [70, 70, 60]


def _enabled(bus: EventBus) -> bool | None:
    slo = bus.state.node_slo
    t = None if slo is None else slo.resource_used_threshold_with_be
    return None if t is None else t.enable


def threshold_of(event: NodeSLOUpdated) -> int | None:
    t = event.slo.resource_used_threshold_with_be
    return t.cpu_suppress_threshold_percent if t else None


async def test_missing_nodeslo_means_defaults_and_deletion_restores_them(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    fake.upsert("nodes", make_node(NODE))
    async with running(bus, conn, fast) as s:
        await s.synced()
        assert bus.state.node_slo == default_nodeslo()
        fake.upsert(
            "nodeslos",
            make_nodeslo(NODE, {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 50}}),
        )
        await wait_until(lambda: threshold(bus) == 50, message="NodeSLO created")
        fake.delete("nodeslos", NODE)
        await wait_until(lambda: threshold(bus) == 65, message="defaults after deletion")


async def test_nodeslo_resource_not_served_means_defaults(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    fake.upsert("nodes", make_node(NODE))
    fake.fail_next(NODESLOS_PATH, status=404, times=1000)
    async with running(bus, conn, fast) as s:
        await s.synced()
        assert bus.state.node_slo == default_nodeslo()


async def test_missing_node_keeps_the_source_unsynced_until_it_appears(
    fake: FakeAPIServer, bus: EventBus, conn: KubeConnection, fast: ReflectorSettings
) -> None:
    async with running(bus, conn, fast) as s:
        await wait_until(lambda: {"pods", "nodeslo"} <= bus.state.synced, message="pods and nodeslo synced")
        assert "node" not in bus.state.synced
        fake.upsert("nodes", make_node(NODE))
        await s.synced()


async def test_malformed_objects_are_skipped_counted_and_the_source_keeps_going() -> None:
    from koordqos.events.types import PodUpserted
    from koordqos.kube.watch import WatchEvent

    bus = EventBus()
    seen: list[object] = []
    bus.subscribe("t", lambda e, s: seen.append(e), PodsReplaced, PodUpserted, NodeUpdated)
    runner = asyncio.create_task(bus.run())
    before = obs.REGISTRY.get_sample_value(
        "koordqos_errors_total", {"component": "kube", "kind": "malformed-pod"}
    )
    pods = PodSource(bus, NODE)
    good = make_pod("good", NODE, uid="u-good")
    bad_meta = {"metadata": ["not", "a", "mapping"], "spec": {}}
    bad_labels = make_pod("bad", NODE, uid="u-bad")
    bad_labels["metadata"]["labels"] = ["x"]
    await pods.on_list([good, bad_meta, "garbage", bad_labels])  # type: ignore[list-item]
    await pods.on_event(WatchEvent("MODIFIED", {"metadata": 5}))
    await pods.on_event(WatchEvent("ADDED", make_pod("later", NODE, uid="u-later")))
    nodes = NodeSource(bus, NODE)
    await nodes.on_event(WatchEvent("MODIFIED", {"metadata": {"name": NODE}, "status": ["broken"]}))
    await bus.drained()
    runner.cancel()
    replaced = [e for e in seen if isinstance(e, PodsReplaced)]
    # unusable objects are skipped; a pod with a malformed part is kept without that part
    assert [p.uid for p in replaced[0].pods] == ["u-good", "u-bad"]
    assert dict(replaced[0].pods[1].labels) == {}
    assert [e.pod.uid for e in seen if isinstance(e, PodUpserted)] == ["u-later"]
    after = obs.REGISTRY.get_sample_value(
        "koordqos_errors_total", {"component": "kube", "kind": "malformed-pod"}
    )
    assert (after or 0) - (before or 0) >= 2  # "garbage" and the list-shaped metadata at least


async def test_a_pod_with_a_deeply_nested_annotation_is_kept_with_the_rest_of_its_data() -> None:
    # issue #15 item 1: ~1 KB of nested brackets made parse_pod raise RecursionError and the pod was dropped
    from koordqos.events.types import PodUpserted
    from koordqos.kube.watch import WatchEvent

    bus = EventBus()
    seen: list[object] = []
    bus.subscribe("t", lambda e, s: seen.append(e), PodsReplaced, PodUpserted)
    runner = asyncio.create_task(bus.run())
    pods = PodSource(bus, NODE)
    nested = "[" * 1000 + "]" * 1000
    bad = make_pod("nested", NODE, uid="u-nested", qos="BE")
    bad["metadata"]["annotations"] = {
        "node.koordinator.sh/extended-resource-spec": nested,
        "koordinator.sh/eviction-priority": "4",
    }
    later = make_pod("nested-2", NODE, uid="u-nested-2")
    later["metadata"]["annotations"] = {"scheduling.koordinator.sh/resource-status": nested}
    await pods.on_list([make_pod("good", NODE, uid="u-good"), bad])
    await pods.on_event(WatchEvent("ADDED", later))
    await bus.drained()
    runner.cancel()
    replaced = [e for e in seen if isinstance(e, PodsReplaced)]
    assert [p.uid for p in replaced[0].pods] == ["u-good", "u-nested"]
    kept = replaced[0].pods[1]
    assert kept.qos is QoSClass.BE
    assert kept.eviction_priority == 4
    assert "node.koordinator.sh/extended-resource-spec" in kept.problems
    upserted = [e.pod for e in seen if isinstance(e, PodUpserted)]
    assert [p.uid for p in upserted] == ["u-nested-2"]
    assert "scheduling.koordinator.sh/resource-status" in upserted[0].problems
