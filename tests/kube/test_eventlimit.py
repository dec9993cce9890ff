"""Rate-limited Events: one per object and reason per interval, through the real recorder and the fake API
server; the held-back ones are counted and summed into the next Event."""

from __future__ import annotations

from koordqos import observability as obs
from koordqos.kube import KubeConnection
from koordqos.kube.eventlimit import RateLimitedRecorder
from koordqos.kube.eventrecorder import pod_reference
from tests.support.fake_apiserver import FakeAPIServer

from .conftest import NODE


def held(reason: str) -> float:
    return obs.REGISTRY.get_sample_value("koordqos_kube_events_rate_limited_total", {"reason": reason}) or 0.0


async def test_repeats_within_the_interval_are_held_back_and_summed(
    fake: FakeAPIServer, conn: KubeConnection
) -> None:
    now = [100.0]
    rec = RateLimitedRecorder(conn.get, NODE, interval=60, clock=lambda: now[0])
    node = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-n"}
    before = held("BECPUSuppressed")
    assert await rec.record(node, "Normal", "BECPUSuppressed", "quota -1 → 2000 µs") is True
    now[0] += 10
    assert await rec.record(node, "Normal", "BECPUSuppressed", "quota 2000 → 40000 µs") is False
    now[0] += 10
    assert await rec.record(node, "Normal", "BECPUSuppressed", "quota 40000 → 80000 µs") is False
    assert [e["message"] for e in fake.events] == ["quota -1 → 2000 µs"]
    assert held("BECPUSuppressed") == before + 2
    now[0] += 41  # 61 s after the first
    assert await rec.record(node, "Normal", "BECPUSuppressed", "quota 80000 → 120000 µs") is True
    assert fake.events[-1]["message"] == "quota 80000 → 120000 µs (+2 more in the last 60 s)"
    assert fake.events[-1]["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": "uid-n",
    }
    assert fake.events[-1]["metadata"]["namespace"] == "default"  # where a cluster-scoped object's Events go


async def test_other_objects_and_reasons_are_not_held_back(fake: FakeAPIServer, conn: KubeConnection) -> None:
    now = [0.0]
    rec = RateLimitedRecorder(conn.get, NODE, interval=60, clock=lambda: now[0])
    a, b = pod_reference("ns", "a", "ua"), pod_reference("ns", "b", "ub")
    assert await rec.record(a, "Warning", "evictPodSuccess", "a evicted") is True
    assert await rec.record(b, "Warning", "evictPodSuccess", "b evicted") is True
    assert await rec.record(a, "Warning", "evictPodFail", "a failed") is True
    assert await rec.record(a, "Warning", "evictPodSuccess", "a again") is False
    assert [e["message"] for e in fake.events] == ["a evicted", "b evicted", "a failed"]
