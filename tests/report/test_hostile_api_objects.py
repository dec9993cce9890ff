"""Issue #39, the other reporters: hostile numbers and shapes in what the NRT and standalone batch reporters
read from the fake API server (the NRT in the cluster, the Node's annotations). A round never raises: what no
object can hold is rejected, logged and counted; the reporter writes a clean object and converges."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from koordqos import observability as obs
from koordqos.kube.client import ClientConfig, KubeClient
from koordqos.model.node import parse_node
from tests.support.fake_apiserver import FakeAPIServer, make_node

from .conftest import FakeClock
from .test_report_reporters import NODE, batch, nrt_reporter


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


def rejected(kind: str) -> float:
    return obs.REGISTRY.get_sample_value("koordqos_report_invalid_fields_total", {"kind": kind}) or 0.0


def hostile_nrt() -> dict[str, Any]:
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": NODE, "annotations": {"vendor.example/count": 5}, "labels": {"x": None}},
        "topologyPolicies": 7,
        "zones": [
            {
                "name": "node-0",
                "type": "Node",
                "resources": [
                    {"name": "vendor.example/gpu", "capacity": math.nan, "allocatable": "1"},
                    {"name": "vendor.example/fpga", "capacity": "2", "allocatable": "2", "available": "2"},
                ],
            },
            {"name": 5, "type": "Node"},
            {"name": "node-1", "type": "Node", "resources": {"cpu": math.inf}},
        ],
    }


async def test_a_hostile_nrt_in_the_cluster_is_replaced_by_a_clean_one(
    tmp_path: Path, fake: FakeAPIServer, client: KubeClient
) -> None:
    fake.upsert("noderesourcetopologies", hostile_nrt())
    before = rejected("NodeResourceTopology")
    r = nrt_reporter(tmp_path, client, [])
    record = await r.round()
    assert record is not None
    assert (record.outcome, record.detail) == ("written", "updated")
    stored = fake.get("noderesourcetopologies", NODE)
    assert stored is not None
    json.dumps(stored, allow_nan=False)  # what a real API server can hold
    assert stored["topologyPolicies"] == ["None"]
    assert stored["metadata"]["annotations"].get("vendor.example/count") is None
    assert "node.koordinator.sh/cpu-shared-pools" in stored["metadata"]["annotations"]
    zones = {z["name"]: z for z in stored["zones"]}
    assert set(zones) == {"node-0", "node-1"}
    kept = {res["name"] for res in zones["node-0"]["resources"]}
    assert "vendor.example/fpga" in kept  # another party's clean resource stays
    assert "vendor.example/gpu" not in kept  # its NaN capacity: dropped
    # the non-string annotation and label, the policies, the NaN resource, the zone without a name and the
    # resources that are not a list
    assert rejected("NodeResourceTopology") == before + 6

    assert isinstance(r.clock, FakeClock)
    r.clock.t += 61  # the resync: GET and compare; the clean object is current
    again = await r.round()
    assert again is not None
    assert again.outcome == "unchanged"
    assert rejected("NodeResourceTopology") == before + 6


@pytest.mark.parametrize("ratio", ["inf", "1e400", "nan", "7", "-1"])
async def test_a_hostile_cpu_normalization_ratio_leaves_batch_cpu_unscaled(
    fake: FakeAPIServer, client: KubeClient, ratio: str
) -> None:
    node = make_node(NODE, cpu="16", memory="64Gi")
    node["status"]["allocatable"] = {"cpu": "15", "memory": "62Gi", "pods": "110"}
    node["metadata"]["annotations"] = {"node.koordinator.sh/cpu-normalization-ratio": ratio}
    fake.upsert("nodes", node)
    clock = FakeClock()
    b = batch(fake, client, clock)
    b.bus._state = replace(b.bus.state, node=parse_node(node))  # the Node as the API server serves it
    record = await b.round()
    assert record.outcome == "written"
    assert b.bus.state.node is not None
    assert b.bus.state.node.cpu_normalization_ratio is None
    assert "node.koordinator.sh/cpu-normalization-ratio" in b.bus.state.node.problems
    stored = fake.get("nodes", NODE)
    assert stored is not None
    # the batch worked example's value (docs/reporting.md, "Batch formula"), unscaled
    assert stored["status"]["allocatable"]["kubernetes.io/batch-cpu"] == "3600"
