"""The reporter components against the fake API server: NodeMetric rounds (spec, no status over an empty
window, conflicts, missing object), NRT create/update/resync with the manager's additions kept, and the
standalone batch capacity of the batch worked example patched onto the Node (plus refusal and degrade;
docs/reporting.md, "No status over an empty window", "Batch formula" and "Standalone batch and Mid
capacity")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType

import pytest

from koordqos.bus import EventBus
from koordqos.errors import ConfigError
from koordqos.events.types import MetricTick
from koordqos.kube.client import ClientConfig, KubeClient
from koordqos.kube.reportwriters import NodeBatchPatcher, NodeMetricWriter, NRTWriter
from koordqos.metrics.hardware import read_hardware
from koordqos.metrics.topology import read_topology
from koordqos.model.node import parse_node
from koordqos.model.pod import parse_pod
from koordqos.report.batchreporter import BatchCapacityReporter
from koordqos.report.history import ReportHistory
from koordqos.report.kubelet import KubeletCPUManager
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.report.pools import SharePools
from koordqos.report.topologyreporter import KubeletSources, TopologyReporter
from koordqos.state import NodeState
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodemetric, make_pod

from .conftest import FakeClock, feed
from .test_report_batch_example import LOAD
from .test_report_nrt import EXAMPLE_PODS, example_node

NODE = "node-a"
WALL = 1796149800.0


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


@pytest.fixture
async def fake() -> AsyncIterator[FakeAPIServer]:
    server = FakeAPIServer(token=None)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(fake: FakeAPIServer) -> AsyncIterator[KubeClient]:
    c = KubeClient(ClientConfig(host=fake.url))
    yield c
    await c.close()


def worked_state() -> NodeState:
    node = make_node(NODE, cpu="16", memory="64Gi")
    node["status"]["allocatable"] = {"cpu": "15", "memory": "62Gi", "pods": "110"}
    raw = [
        make_pod("web-0", NODE, uid="u-web", requests={"cpu": "4", "memory": "8Gi"}),
        make_pod(
            "db-0",
            NODE,
            uid="u-db",
            requests={"cpu": "2", "memory": "4Gi"},
            limits={"cpu": "2", "memory": "4Gi"},
        ),
        make_pod(
            "spark-1",
            NODE,
            "batch",
            qos="BE",
            uid="u-spark",
            labels={"koordinator.sh/priority-class": "koord-batch"},
        ),
        make_pod("new-0", NODE, uid="u-new", requests={"cpu": "1", "memory": "2Gi"}),
        # deleted from the manager's view (terminal), still known to the agent with samples in the window
        make_pod("old-0", NODE, uid="u-old", phase="Failed", requests={"cpu": "100m"}),
    ]
    pods = {p.uid: p for p in (parse_pod(r) for r in raw)}
    return NodeState(pods=MappingProxyType(pods), node=parse_node(node))


def reporter(client: KubeClient | None, state: NodeState, clock: FakeClock) -> NodeMetricReporter:
    bus = EventBus(state=state)
    writer = None if client is None else NodeMetricWriter(client, NODE, sleep=no_sleep)
    return NodeMetricReporter(bus, ReportHistory(1.0, clock=clock), writer, wall=lambda: WALL, sleep=no_sleep)


# -- NodeMetric -------------------------------------------------------------------------------------------


async def test_round_writes_the_status_and_keeps_the_spec(fake: FakeAPIServer, client: KubeClient) -> None:
    spec = {
        "metricCollectPolicy": {"aggregateDurationSeconds": 120, "nodeAggregatePolicy": {"durations": ["2m"]}}
    }
    fake.upsert("nodemetrics", make_nodemetric(NODE, spec))
    clock = FakeClock()
    r = reporter(client, worked_state(), clock)
    assert await r.refresh_policy()
    assert r.policy.aggregate_seconds == 120
    feed(r.history, clock, 130, LOAD)
    record = await r.round()
    assert record.outcome == "written"
    stored = fake.get("nodemetrics", NODE)
    assert stored is not None
    assert stored["spec"] == spec
    status = stored["status"]
    assert status["updateTime"] == "2026-12-01T18:30:00Z"
    assert status["nodeMetric"]["systemUsage"] == {"resources": {"cpu": "1200m", "memory": "3Gi"}}
    assert [a["duration"] for a in status["nodeMetric"]["aggregatedNodeUsages"]] == ["2m0s"]
    assert {p["name"] for p in status["podsMetric"]} == {"web-0", "db-0", "spark-1", "old-0"}
    debug = r.debug_state()
    assert debug["last"]["outcome"] == "written"
    assert debug["last"]["writtenAt"] == "2026-12-01T18:30:00Z"


async def test_written_at_is_the_written_status_update_time(fake: FakeAPIServer, client: KubeClient) -> None:
    """The wall clock moves between the round's start and the build (a loaded node: seconds): /debug/state's
    writtenAt is still the updateTime of the status written."""
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    clock = FakeClock()
    walls = iter(WALL + 2.0 * i for i in range(100))
    r = NodeMetricReporter(
        EventBus(state=worked_state()),
        ReportHistory(1.0, clock=clock),
        NodeMetricWriter(client, NODE, sleep=no_sleep),
        wall=lambda: next(walls),
        sleep=no_sleep,
    )
    assert await r.refresh_policy()
    feed(r.history, clock, 130, LOAD)
    record = await r.round()
    assert record.outcome == "written"
    stored = fake.get("nodemetrics", NODE)
    assert stored is not None
    assert record.built_at != stored["status"]["updateTime"]  # the clock did move within the round
    assert r.debug_state()["last"]["writtenAt"] == stored["status"]["updateTime"]


async def test_missing_nodemetric_is_never_created(fake: FakeAPIServer, client: KubeClient) -> None:
    clock = FakeClock()
    r = reporter(client, worked_state(), clock)
    feed(r.history, clock, 30, LOAD)
    assert (await r.round()).outcome == "missing"
    assert fake.get("nodemetrics", NODE) is None
    fake.upsert("nodemetrics", make_nodemetric(NODE))  # the manager creates it later: reporting resumes
    assert (await r.round()).outcome == "written"


async def test_no_status_over_an_empty_window(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    clock = FakeClock()
    r = reporter(client, worked_state(), clock)
    record = await r.round()
    assert record.outcome == "skipped"
    stored = fake.get("nodemetrics", NODE)
    assert stored is not None
    assert "status" not in stored
    assert fake.count_requests(lambda m, p, q: m == "PUT") == 0


async def test_conflicting_write_is_retried(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    clock = FakeClock()
    r = reporter(client, worked_state(), clock)
    feed(r.history, clock, 30, LOAD)
    fake.fail_next("/status", 409, method="PUT")
    assert (await r.round()).outcome == "written"
    assert fake.count_requests(lambda m, p, q: m == "PUT" and p.endswith("/status")) == 2
    stored = fake.get("nodemetrics", NODE)
    assert stored is not None
    assert "nodeMetric" in stored["status"]


async def test_history_fed_from_ticks_and_pods_retained(client: KubeClient) -> None:
    clock = FakeClock()
    state = worked_state()
    r = reporter(None, state, clock)
    r._on_tick(MetricTick(at=0.0, sample=LOAD), state)
    assert set(r.history.pods) == {"u-web", "u-db", "u-spark", "u-old"}
    smaller = NodeState(
        pods=MappingProxyType({k: v for k, v in state.pods.items() if k != "u-old"}), generation=5
    )
    r._on_tick(MetricTick(at=1.0, sample=LOAD), smaller)
    assert "u-old" not in r.history.pods


async def test_runtime_events_alone_do_not_rescan_the_pods(client: KubeClient) -> None:
    from dataclasses import replace

    clock = FakeClock()
    state = worked_state()
    r = reporter(None, state, clock)
    r._on_tick(MetricTick(at=0.0, sample=LOAD), state)
    scans: list[object] = []
    retain = r.history.retain_pods
    r.history.retain_pods = lambda uids: scans.append(uids) or retain(uids)  # type: ignore[method-assign]
    # a container event: a new generation, the same pods map (36 of these a second under churn)
    r._on_tick(MetricTick(at=1.0, sample=LOAD), replace(state, generation=state.generation + 7))
    assert scans == []
    fewer = replace(state, pods=MappingProxyType({k: v for k, v in state.pods.items() if k != "u-old"}))
    r._on_tick(MetricTick(at=2.0, sample=LOAD), fewer)
    assert len(scans) == 1
    assert "u-old" not in r.history.pods


# -- NRT ----------------------------------------------------------------------------------------------------


def nrt_reporter(tmp_path: Path, client: KubeClient | None, pools: list[SharePools]) -> TopologyReporter:
    """A reporter on the NRT worked example's node (docs/reporting.md, "Share pools and reserved CPUs"); every
    NRT result handed to local users lands in `pools`."""
    sys_root, proc_root = example_node(tmp_path)
    node = parse_node(
        make_node(NODE, annotations={"node.koordinator.sh/reservation": '{"reservedCPUs":"0"}'})
    )
    state = NodeState(pods=MappingProxyType({p.uid: p for p in EXAMPLE_PODS}), node=node)
    return TopologyReporter(
        EventBus(state=state),
        NODE,
        read_topology(sys_root),
        read_hardware(proc_root, sys_root),
        None if client is None else NRTWriter(client, NODE, sleep=no_sleep),
        kubelet=KubeletSources(
            explicit=KubeletCPUManager(policy="none", source="config"), kubelet_root=tmp_path
        ),
        on_topology=lambda want: pools.append(want.pools),
        clock=FakeClock(),
        wall=lambda: WALL,
    )


async def test_nrt_created_then_written_only_on_change(
    tmp_path: Path, fake: FakeAPIServer, client: KubeClient
) -> None:
    pools: list[SharePools] = []
    r = nrt_reporter(tmp_path, client, pools)
    first = await r.round()
    assert first is not None
    assert (first.outcome, first.detail) == ("written", "created")
    stored = fake.get("noderesourcetopologies", NODE)
    assert stored is not None
    ann = stored["metadata"]["annotations"]
    assert (
        ann["node.koordinator.sh/cpu-shared-pools"]
        == '[{"socket":0,"node":0,"cpuset":"1"},{"socket":0,"node":1,"cpuset":"4-5"}]'
    )
    assert [p.cpuset for p in pools[0].be] == ["1-3", "4-5"]
    requests = len(fake.requests)
    await r.round()
    assert len(fake.requests) == requests  # nothing changed: no API call at all
    # the manager adds batch resources to the zones; a pod change makes the agent update: they are kept
    stored["zones"][0]["resources"].append(
        {"name": "kubernetes.io/batch-cpu", "capacity": "1", "allocatable": "1", "available": "1"}
    )
    fake.upsert("noderesourcetopologies", stored)
    trader_gone = NodeState(
        pods=MappingProxyType({EXAMPLE_PODS[0].uid: EXAMPLE_PODS[0]}), node=r.bus.state.node
    )
    r.bus._state = trader_gone
    third = await r.round()
    assert third is not None
    assert (third.outcome, third.detail) == ("written", "updated")
    stored = fake.get("noderesourcetopologies", NODE)
    assert stored is not None
    assert (
        json.loads(stored["metadata"]["annotations"]["node.koordinator.sh/be-cpu-shared-pools"])[1]["cpuset"]
        == "4-7"
    )
    assert any(res["name"] == "kubernetes.io/batch-cpu" for res in stored["zones"][0]["resources"])
    assert len(pools) == 2


async def test_deleted_nrt_recreated_at_resync(
    tmp_path: Path, fake: FakeAPIServer, client: KubeClient
) -> None:
    r = nrt_reporter(tmp_path, client, [])
    await r.round()
    fake.delete("noderesourcetopologies", NODE)
    assert isinstance(r.clock, FakeClock)
    r.clock.t += 61
    record = await r.round()
    assert record is not None
    assert record.detail == "created"
    assert fake.get("noderesourcetopologies", NODE) is not None


async def test_nrt_reporter_stops_when_cancelled_as_a_pod_event_wakes_it(tmp_path: Path) -> None:
    """A pod event and the agent's stop in the same loop step: the cancellation is not lost (it was with
    `asyncio.wait_for` on Python 3.11, and the agent never exited)."""
    r = nrt_reporter(tmp_path, None, [])
    task = asyncio.create_task(r.run())
    # the first round ran; from its end to the wait for a wake-up nothing yields: the task is parked there
    await wait_until(lambda: r.last is not None, timeout=10, interval=0.01)
    r._wake.set()  # what _on_change does for a pod event
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    if not done:
        task.cancel()  # do not leave it running after the test
    assert done, "the NRT reporter ignored its cancellation"
    assert task.cancelled()


async def test_nrt_local_only_without_writer(tmp_path: Path) -> None:
    pools: list[SharePools] = []
    r = nrt_reporter(tmp_path, None, pools)
    record = await r.round()
    assert record is not None
    assert record.outcome == "computed"
    assert pools
    assert r.debug_state()["pools"]["ls"] == [
        {"socket": 0, "node": 0, "cpuset": "1"},
        {"socket": 0, "node": 1, "cpuset": "4-5"},
    ]


async def test_kubelet_policy_from_checkpoint_when_not_configured(tmp_path: Path) -> None:
    r = nrt_reporter(tmp_path, None, [])
    r.kubelet = KubeletSources(kubelet_root=tmp_path)
    want = await r.compute()
    assert want is not None
    assert "kubelet.koordinator.sh/cpu-manager-policy" not in want.annotations  # no source: left alone
    (tmp_path / "cpu_manager_state").write_text(
        '{"policyName":"static","defaultCpuSet":"0-7","entries":{"u1":{"c":"6"}},"checksum":1}'
    )
    want = await r.compute()
    assert want is not None
    assert want.annotations["kubelet.koordinator.sh/cpu-manager-policy"] == '{"policy":"static"}'
    assert json.loads(want.annotations["node.koordinator.sh/pod-cpu-allocs"]) == [
        {"uid": "u1", "cpuset": "6", "managedByKubelet": True}
    ]


# -- standalone batch capacity -------------------------------------------------------------------------------


def batch(fake: FakeAPIServer, client: KubeClient, clock: FakeClock) -> BatchCapacityReporter:
    r = reporter(None, worked_state(), clock)
    feed(r.history, clock, 360, LOAD)

    async def manager_present() -> bool:
        return fake.get("nodemetrics", NODE) is not None

    return BatchCapacityReporter(
        r.bus,
        NODE,
        r,
        NodeBatchPatcher(client, NODE),
        manager_present,
        wall=lambda: WALL,
        clock=clock,
        sleep=no_sleep,
    )


async def test_standalone_patches_the_worked_example(fake: FakeAPIServer, client: KubeClient) -> None:
    node = make_node(NODE, cpu="16", memory="64Gi")
    node["status"]["allocatable"] = {"cpu": "15", "memory": "62Gi", "pods": "110"}
    fake.upsert("nodes", node)
    clock = FakeClock()
    b = batch(fake, client, clock)
    await b.preflight()
    record = await b.round()
    assert record.outcome == "written"
    stored = fake.get("nodes", NODE)
    assert stored is not None
    for part in ("capacity", "allocatable"):
        assert stored["status"][part]["kubernetes.io/batch-cpu"] == "3600"
        assert stored["status"][part]["kubernetes.io/batch-memory"] == "30709016167"
    assert stored["status"]["allocatable"]["cpu"] == "15"
    assert (await b.round()).outcome == "unchanged"  # same values within 300 s: no write


async def test_standalone_degrades_when_own_metrics_go_stale(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodes", make_node(NODE, cpu="16", memory="64Gi"))
    clock = FakeClock()
    b = batch(fake, client, clock)
    assert (await b.round()).outcome == "written"
    clock.t += 400  # no samples since: the report cannot be built
    assert (await b.round()).outcome == "skipped"
    stored = fake.get("nodes", NODE)
    assert stored is not None
    assert "kubernetes.io/batch-cpu" in stored["status"]["allocatable"]
    clock.t += 15 * 60
    assert (await b.round()).outcome == "degraded"
    stored = fake.get("nodes", NODE)
    assert stored is not None
    assert "kubernetes.io/batch-cpu" not in stored["status"]["allocatable"]
    assert "kubernetes.io/batch-memory" not in stored["status"]["capacity"]


async def test_standalone_refused_when_a_manager_is_present(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    b = batch(fake, client, FakeClock())
    with pytest.raises(ConfigError, match="koord-manager"):
        await b.preflight()


async def test_standalone_stops_when_a_manager_appears(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodes", make_node(NODE, cpu="16", memory="64Gi"))
    b = batch(fake, client, FakeClock())
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    assert (await b.round()).outcome == "stopped"
    assert fake.count_requests(lambda m, p, q: m == "PATCH") == 0


async def test_nrt_unchanged_inputs_reuse_the_last_result(tmp_path: Path) -> None:
    r = nrt_reporter(tmp_path, None, [])
    first = await r.compute()
    assert first is not None
    assert await r.compute() is first  # same pods, Node and kubelet: no recomputation
    r.bus._state = NodeState(
        pods=MappingProxyType({EXAMPLE_PODS[0].uid: EXAMPLE_PODS[0]}), node=r.bus.state.node
    )
    second = await r.compute()
    assert second is not None
    assert second is not first
    assert [p.cpuset for p in second.pools.be] == ["1-3", "4-7"]
