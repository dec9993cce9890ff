"""Standalone mode (`--batch-resource-source=agent`) sets the Mid tier with koord-manager's formula from the
agent's own prodReclaimableMetric (docs/prediction.md, "Mid formula" and "Standalone mode"): against the fake
API server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from koordqos.kube.client import ClientConfig, KubeClient
from koordqos.kube.reportwriters import NodeBatchPatcher
from koordqos.report.batchreporter import BatchCapacityReporter
from tests.support.fake_apiserver import FakeAPIServer, make_node

from ..prediction.test_worked_example import World, run_25_hours

NODE = "node-a"


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


async def no_sleep(_: float) -> None:
    return None


def standalone(
    world: World, fake: FakeAPIServer, client: KubeClient, clock: list[float]
) -> BatchCapacityReporter:
    async def manager_present() -> bool:
        return fake.get("nodemetrics", NODE) is not None

    return BatchCapacityReporter(
        world.reporter.bus,
        NODE,
        world.reporter,
        NodeBatchPatcher(client, NODE),
        manager_present,
        wall=lambda: world.wall[0],
        clock=lambda: clock[0],
        sleep=no_sleep,
    )


async def test_mid_resources_of_the_worked_example(
    tmp_path: Path, fake: FakeAPIServer, client: KubeClient
) -> None:
    world = await run_25_hours(tmp_path)
    fake.upsert("nodes", make_node(NODE, cpu="8", memory="32Gi"))
    clock = [1000.0]
    b = standalone(world, fake, client, clock)
    record = await b.round()
    assert record.outcome == "written"
    stored = fake.get("nodes", NODE)
    assert stored is not None
    for part in ("capacity", "allocatable"):
        assert stored["status"][part]["kubernetes.io/mid-cpu"] == "2489"
        assert stored["status"][part]["kubernetes.io/mid-memory"] == "4998039436"
        assert "kubernetes.io/batch-cpu" in stored["status"][part]
    assert record.body is not None
    assert record.body["kubernetes.io/mid-cpu"] == 2489
    # no samples any more (the report cannot be built) for 15 min: Mid goes with batch
    world.clock.t += 400
    assert (await b.round()).outcome == "skipped"
    clock[0] += 15 * 60
    assert (await b.round()).outcome == "degraded"
    stored = fake.get("nodes", NODE)
    assert stored is not None
    for part in ("capacity", "allocatable"):
        assert "kubernetes.io/mid-cpu" not in stored["status"][part]
        assert "kubernetes.io/mid-memory" not in stored["status"][part]
