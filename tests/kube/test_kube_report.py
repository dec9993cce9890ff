"""Report actuators against the fake API server's real semantics (status subresource, 409 on a stale
resourceVersion, NRT create/update) — docs/reporting.md, "Status writes" and "NRT writes"."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from koordqos.kube.client import ApiError, KubeClient
from koordqos.kube.reportwriters import NodeBatchPatcher, NodeMetricWriter, NRTWriter
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodemetric

NODE = "node-a"
PATH = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics/node-a"
NRT = "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


def status(cpu: str = "1", t: str = "2026-12-01T18:30:00Z") -> dict[str, Any]:
    return {"updateTime": t, "nodeMetric": {"nodeUsage": {"resources": {"cpu": cpu, "memory": "1Gi"}}}}


# -- the fake server's semantics -------------------------------------------------------------------------


async def test_status_subresource_semantics(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 60}}))
    obj = await client.request("GET", PATH)
    body = {**obj, "status": status(), "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 1}}}
    written = await client.request("PUT", PATH + "/status", body=body)
    assert written["status"] == status()
    assert written["spec"] == {"metricCollectPolicy": {"reportIntervalSeconds": 60}}  # /status: spec kept
    main = {**written, "status": status("9"), "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 90}}}
    after = await client.request("PUT", PATH, body=main)
    assert after["status"] == status()  # main resource: status kept
    assert after["spec"] == {"metricCollectPolicy": {"reportIntervalSeconds": 90}}


async def test_stale_resource_version_is_409(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    obj = await client.request("GET", PATH)
    fake.upsert(
        "nodemetrics", make_nodemetric(NODE, {"metricCollectPolicy": {"aggregateDurationSeconds": 120}})
    )
    with pytest.raises(ApiError) as info:
        await client.request("PUT", PATH + "/status", body={**obj, "status": status()})
    assert info.value.status == 409
    assert info.value.reason == "Conflict"
    with pytest.raises(ApiError) as missing:
        await client.request(
            "PUT", PATH.replace("node-a", "node-x") + "/status", body={"metadata": {"name": "node-x"}}
        )
    assert missing.value.status == 404


async def test_nrt_create_conflict_and_merge_patch(fake: FakeAPIServer, client: KubeClient) -> None:
    body = {"metadata": {"name": NODE}, "topologyPolicies": ["None"], "zones": []}
    created = await client.request("POST", NRT, body=body)
    assert created["kind"] == "NodeResourceTopology"
    with pytest.raises(ApiError) as info:
        await client.request("POST", NRT, body=body)
    assert (info.value.status, info.value.reason) == (409, "AlreadyExists")
    fake.upsert("nodes", make_node(NODE))
    patched = await client.request(
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        body={
            "status": {"allocatable": {"kubernetes.io/batch-cpu": "3600"}},
            "spec": {"unschedulable": True},
        },
        content_type="application/merge-patch+json",
    )
    assert patched["status"]["allocatable"]["kubernetes.io/batch-cpu"] == "3600"
    assert patched["status"]["allocatable"]["cpu"] == "8"
    assert "unschedulable" not in patched.get("spec", {})


# -- NodeMetric writer -------------------------------------------------------------------------------------


async def test_writer_never_creates_the_nodemetric(fake: FakeAPIServer, client: KubeClient) -> None:
    writer = NodeMetricWriter(client, NODE, clock=Clock(), sleep=no_sleep)
    out = await writer.write(status())
    assert out.outcome == "missing"
    assert fake.get("nodemetrics", NODE) is None
    assert fake.count_requests(lambda m, p, q: m in ("POST", "PUT")) == 0


async def test_writer_retries_conflicts_with_a_fresh_get(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    writer = NodeMetricWriter(client, NODE, clock=Clock(), sleep=no_sleep)
    assert await writer.read() is not None
    # the manager rewrites the spec after our read: our cached resourceVersion is stale
    fake.upsert("nodemetrics", make_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 30}}))
    out = await writer.write(status())
    assert out.outcome == "written"
    assert out.conflicts == 1
    assert out.attempts == 2
    stored = fake.get("nodemetrics", NODE)
    assert stored is not None
    assert stored["status"] == status()
    assert stored["spec"] == {"metricCollectPolicy": {"reportIntervalSeconds": 30}}
    assert out.resource_version == stored["metadata"]["resourceVersion"]


async def test_writer_gives_up_after_four_conflicts(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    fake.fail_next("/status", 409, times=10, method="PUT")
    writer = NodeMetricWriter(client, NODE, clock=Clock(), sleep=no_sleep)
    out = await writer.write(status())
    assert (out.outcome, out.attempts, out.conflicts) == ("failed", 4, 4)
    assert fake.count_requests(lambda m, p, q: m == "PUT" and p.endswith("/status")) == 4


async def test_writer_rate_limit_and_unchanged(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    clock = Clock()
    writer = NodeMetricWriter(client, NODE, clock=clock, sleep=no_sleep)
    assert (await writer.write(status())).outcome == "written"
    clock.t += 5
    assert (await writer.write(status(t="2026-12-01T18:30:05Z"))).outcome == "unchanged"
    assert (await writer.write(status("2"))).outcome == "limited"  # changed, but within 10 s
    clock.t += 6
    assert (await writer.write(status("2"))).outcome == "written"
    assert fake.count_requests(lambda m, p, q: m == "PUT") == 2


async def test_writer_token_bucket(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    clock = Clock()
    writer = NodeMetricWriter(client, NODE, min_write_interval=0, clock=clock, sleep=no_sleep)
    assert (await writer.write(status("1"))).outcome == "written"
    clock.t += 1
    assert (await writer.write(status("2"))).outcome == "written"  # burst 2
    clock.t += 1
    assert (await writer.write(status("3"))).outcome == "limited"  # 0.2 tokens at 0.1 QPS
    clock.t += 9
    assert (await writer.write(status("3"))).outcome == "written"
    assert fake.count_requests(lambda m, p, q: m == "PUT") == 3


async def test_writer_honours_retry_after(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodemetrics", make_nodemetric(NODE))
    fake.fail_next("/status", 429, method="PUT", retry_after=30)
    clock = Clock()
    writer = NodeMetricWriter(client, NODE, clock=clock, sleep=no_sleep)
    assert (await writer.write(status())).outcome == "failed"
    clock.t += 20
    assert (await writer.write(status())).outcome == "skipped"
    clock.t += 11
    assert (await writer.write(status())).outcome == "written"


# -- NRT writer ----------------------------------------------------------------------------------------------


def _modify(value: str) -> Any:
    def modify(current: Any) -> Any:
        obj = dict(current) if current is not None else {"metadata": {"name": NODE}, "zones": []}
        meta = dict(obj.get("metadata") or {})
        ann = dict(meta.get("annotations") or {})
        if ann.get("k") == value:
            return None
        ann["k"] = value
        meta["annotations"] = ann
        obj["metadata"] = meta
        obj["topologyPolicies"] = ["None"]
        return obj

    return modify


async def test_nrt_writer_creates_updates_and_skips(fake: FakeAPIServer, client: KubeClient) -> None:
    writer = NRTWriter(client, NODE, sleep=no_sleep)
    first = await writer.sync(_modify("a"))
    assert (first.outcome, first.detail) == ("written", "created")
    assert (await writer.sync(_modify("a"))).outcome == "unchanged"
    second = await writer.sync(_modify("b"))
    assert (second.outcome, second.detail) == ("written", "updated")
    stored = fake.get("noderesourcetopologies", NODE)
    assert stored is not None
    assert stored["metadata"]["annotations"] == {"k": "b"}
    fake.delete("noderesourcetopologies", NODE)  # deleted by someone: recreated next round
    assert (await writer.sync(_modify("b"))).detail == "created"


async def test_nrt_writer_reapplies_after_conflict(fake: FakeAPIServer, client: KubeClient) -> None:
    writer = NRTWriter(client, NODE, sleep=no_sleep)
    await writer.sync(_modify("a"))
    fake.fail_next(f"{NRT}/{NODE}", 409, method="PUT")
    out = await writer.sync(_modify("b"))
    assert (out.outcome, out.conflicts) == ("written", 1)


async def test_node_batch_patch_sets_and_removes(fake: FakeAPIServer, client: KubeClient) -> None:
    fake.upsert("nodes", make_node(NODE))
    patcher = NodeBatchPatcher(client, NODE)
    out = await patcher.patch(
        {"kubernetes.io/batch-cpu": "3600", "kubernetes.io/batch-memory": "30709016167"}
    )
    assert out.outcome == "written"
    node = fake.get("nodes", NODE)
    assert node is not None
    assert node["status"]["allocatable"]["kubernetes.io/batch-cpu"] == "3600"
    assert node["status"]["capacity"]["kubernetes.io/batch-memory"] == "30709016167"
    await patcher.patch({"kubernetes.io/batch-cpu": None, "kubernetes.io/batch-memory": None})
    node = fake.get("nodes", NODE)
    assert node is not None
    assert "kubernetes.io/batch-cpu" not in node["status"]["allocatable"]
    assert node["status"]["allocatable"]["cpu"] == "8"
