"""The worked example (docs/prediction.md, "Behaviour") end to end, in simulated time: a steady prod pod for
25 hours through the report history (the collector's samples), the prediction server's training rounds, the
NodeMetric status, a checkpoint file and koord-manager's Mid formula — every number to the last digit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import pytest

from koordqos.bus import EventBus
from koordqos.model.node import NodeInfo, parse_node
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.prediction.checkpoint import CheckpointDir
from koordqos.prediction.model import CLASS_UIDS, NODE_UID, SYS_UID, PredictionParams, class_uid
from koordqos.report.batchreporter import standalone_mid_values
from koordqos.report.history import ReportHistory
from koordqos.report.mid import MidStrategy
from koordqos.report.nodemetric import StatusSkipped
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.report.prediction import PredictionServer
from koordqos.state import NodeState

from ..report.conftest import FakeClock, snapshot

Gi = 1 << 30
T0 = 1767225600.0  # 2026-01-01T00:00:00Z
UID = "6a4c1f0e-0000-4000-8000-00000000cafe"
COLLECT = 10.0  # seconds between collections: six points in each one-minute window


def prod_pod(created: str) -> PodInfo:
    return parse_pod(
        {
            "metadata": {"uid": UID, "name": "web-0", "namespace": "default", "creationTimestamp": created},
            "spec": {
                "priority": 9000,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}],
            },
            "status": {"phase": "Running"},
        }
    )


NODE: NodeInfo = parse_node(
    {
        "metadata": {"name": "node-a"},
        "status": {"capacity": {"cpu": "8", "memory": "32Gi"}, "allocatable": {"cpu": "8", "memory": "32Gi"}},
    }
)


@dataclass
class World:
    server: PredictionServer
    reporter: NodeMetricReporter
    state: NodeState
    wall: list[float]
    checkpoints: Path
    clock: FakeClock  # the history's


async def run_25_hours(tmp: Path) -> World:
    pod = prod_pod("2025-12-31T23:00:00Z")
    state = NodeState(pods=MappingProxyType({UID: pod}), node=NODE, synced=frozenset({"pods", "node"}))
    bus = EventBus(state=state)
    clock = FakeClock(0.0)  # the history's monotonic clock: seconds since T0 − 60
    wall = [T0 - 60.0]
    history = ReportHistory(COLLECT, clock=clock)
    snap = snapshot(1.3, 3 * Gi, {UID: (1.0, 2 * Gi)})
    server = PredictionServer(
        bus, history, PredictionParams(), CheckpointDir(tmp), wall=lambda: wall[0], offload=False
    )
    reporter = NodeMetricReporter(bus, history, None, wall=lambda: wall[0], prediction=server)
    for k in range(1501):  # training rounds at T0 + 60 k
        for _ in range(int(60 / COLLECT)):
            clock.t += COLLECT
            wall[0] += COLLECT
            history.ingest(snap)
        assert wall[0] == T0 + 60 * k
        await server.train_round(state)
    return World(server, reporter, state, wall, tmp, clock)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    import asyncio

    return asyncio.run(run_25_hours(tmp_path_factory.mktemp("checkpoints")))


def test_eight_models_with_the_spec_weights(world: World) -> None:
    """pod, `__node__`, five classes, sys: 8 (a description of koordlet that counts 9 is wrong; its own list
    has 8 — the all-pods sum is not a model: docs/prediction.md, "Behaviour" and "Models")."""
    store = world.server.store
    assert sorted(store.models) == sorted([UID, NODE_UID, SYS_UID, *CLASS_UIDS])
    pod = store.models[UID]
    assert pod.cpu.reference_ns == pod.memory.reference_ns == int(T0) * 10**9
    assert pod.cpu.hist.total == 3365.9073549492077
    assert pod.memory.hist.total == 2200.7598750786756
    assert pod.cpu.hist.weights[22] == pod.cpu.hist.total  # one non-empty bucket
    last_cpu = 2 ** (1500 / 720)
    assert last_cpu == 4.237852377437181
    assert 2 ** (1500 / 1440) == 2.058604473286984


@pytest.mark.parametrize(
    ("uid", "cpu_m", "mem"),
    [
        (UID, 1035, 2162529934),
        (class_uid("koord-prod"), 1035, 2162529934),
        (SYS_UID, 314, 1097586419),
        (class_uid(""), 25, 5242880),
        (class_uid("koord-batch"), 25, 5242880),
        (NODE_UID, 1366, 3245106456),
    ],
)
def test_percentiles(world: World, uid: str, cpu_m: int, mem: int) -> None:
    pred = world.server.store.prediction(uid)
    assert pred is not None
    assert {k: (v.cpu_milli, v.memory) for k, v in pred.items()} == dict.fromkeys(
        ("p60", "p90", "p95", "p98", "max"), (cpu_m, mem)
    )


def test_nodemetric_status(world: World) -> None:
    status = world.reporter.build(world.state)
    assert not isinstance(status, StatusSkipped)
    assert status["updateTime"] == "2026-01-02T01:00:00Z"
    assert status["nodeMetric"]["nodeUsage"] == {"resources": {"cpu": "1300m", "memory": "3Gi"}}
    assert status["nodeMetric"]["systemUsage"] == {"resources": {"cpu": "300m", "memory": "1Gi"}}
    assert status["prodReclaimableMetric"] == {
        "resource": {"resources": {"cpu": "2489m", "memory": "4998039436"}}
    }
    assert status["prodPeakMetric"] == {"resource": {"resources": {"cpu": "1511m", "memory": "3591895156"}}}


def test_the_sub_predictors(world: World) -> None:
    from koordqos.prediction.predictors import MinPredictor

    mp = MinPredictor(world.server.store.view, PredictionParams(), world.wall[0])
    mp.add_pod(world.state.pods[UID])
    assert mp.pods.result(NODE) == {"cpu": 2862, "memory": 6211151665}
    assert mp.pods.peak() == {"cpu": 1138, "memory": 2378782927}
    assert mp.priority.result(NODE) == {"cpu": 2489, "memory": 4998039436}
    assert mp.priority.peak() == {"cpu": 1511, "memory": 3591895156}


async def test_checkpoint_file_after_the_last_round(world: World) -> None:
    written = await world.server.checkpoint_round()
    assert written == 8
    text = (world.checkpoints / UID).read_text()
    assert text == (
        '{"UID":"'
        + UID
        + '","CPU":{"referenceTimestamp":"2026-01-01T00:00:00Z","bucketWeights":{"22":10000},'
        '"totalWeight":3365.9073549492077},"Memory":{"referenceTimestamp":"2026-01-01T00:00:00Z",'
        '"bucketWeights":{"62":10000},"totalWeight":2200.7598750786756},"LastUpdated":"2026-01-02T01:00:00Z"}\n'
    )
    assert json.loads((world.checkpoints / "__node-__").read_text())["CPU"]["bucketWeights"] == {"0": 10000}


def test_koord_manager_mid(world: World) -> None:
    status = world.reporter.build(world.state)
    assert not isinstance(status, StatusSkipped)
    mid, why = standalone_mid_values(world.state, status)
    assert why == ""
    assert mid == {"kubernetes.io/mid-cpu": 2489, "kubernetes.io/mid-memory": 4998039436}
    half, _ = standalone_mid_values(world.state, status, MidStrategy(mid_unallocated_percent=50))
    assert half == {"kubernetes.io/mid-cpu": 4339, "kubernetes.io/mid-memory": 17346070412}


def test_a_cold_pod(world: World) -> None:
    """The same models, the pod only 10 h old: reclaimable 0/0, so Mid 0/0; the peak is its request."""
    young = prod_pod("2026-01-01T15:00:00Z")
    state = NodeState(pods=MappingProxyType({UID: young}), node=NODE, synced=world.state.synced)
    status = world.reporter.build(state)
    assert not isinstance(status, StatusSkipped)
    assert status["prodReclaimableMetric"] == {"resource": {"resources": {"cpu": "0", "memory": "0"}}}
    assert status["prodPeakMetric"] == {"resource": {"resources": {"cpu": "4", "memory": "8Gi"}}}
    mid, _ = standalone_mid_values(state, status)
    assert mid == {"kubernetes.io/mid-cpu": 0, "kubernetes.io/mid-memory": 0}
