"""Evictor: Eviction API + UID precondition, Events, evicted-UID cache, PDB 429, 404, dry-run, rate limit."""

from __future__ import annotations

import asyncio

import pytest

from koordqos import observability as obs
from koordqos.decisions import DecisionLog
from koordqos.kube import KubeConnection
from koordqos.kube.eventrecorder import EventRecorder
from koordqos.kube.evictor import EvictedCache, EvictionBackoff, Evictor, TokenBucket
from koordqos.model.pod import PodInfo, parse_pod
from tests.support.fake_apiserver import FakeAPIServer, make_pod

from .conftest import NODE

REASON = "evicted"
MESSAGE = "trigger by koordlet feature BEMemoryEvict, kill pod: p1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def seeded_pod(fake: FakeAPIServer, name: str = "p1") -> PodInfo:
    return parse_pod(fake.upsert("pods", make_pod(name, NODE, qos="BE")))


def api_evictor(fake: FakeAPIServer, conn: KubeConnection, decisions: DecisionLog, **kw: object) -> Evictor:
    return Evictor(decisions, conn.get, EventRecorder(conn.get, NODE), qps=1000, **kw)  # type: ignore[arg-type]


async def test_eviction_success_sends_uid_precondition_event_and_caches(
    fake: FakeAPIServer, conn: KubeConnection
) -> None:
    decisions = DecisionLog()
    ev = api_evictor(fake, conn, decisions)
    pod = seeded_pod(fake)
    before = obs.REGISTRY.get_sample_value(
        "koordqos_pod_evictions_total",
        {"reason": REASON, "result": "success", "namespace": "default", "pod": "p1"},
    )
    assert await ev.evict(pod, REASON, MESSAGE, "MemoryEvict") is True
    assert len(fake.evictions) == 1
    call = fake.evictions[0]
    assert call["body"]["apiVersion"] == "policy/v1"
    assert call["body"]["kind"] == "Eviction"
    assert call["uid"] == pod.uid
    assert fake.get("pods", "p1") is None
    assert [e["reason"] for e in fake.events] == ["evictPodSuccess"]
    event = fake.events[0]
    assert event["message"] == f"evict Pod:default/p1, reason: {REASON}, message: {MESSAGE}"
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "default",
        "name": "p1",
        "uid": pod.uid,
    }
    assert ev.is_evicted(pod)
    after = obs.REGISTRY.get_sample_value(
        "koordqos_pod_evictions_total",
        {"reason": REASON, "result": "success", "namespace": "default", "pod": "p1"},
    )
    assert after == (before or 0) + 1
    assert [d.action for d in decisions.recent()] == ["evict"]


async def test_same_pod_is_never_evicted_twice(fake: FakeAPIServer, conn: KubeConnection) -> None:
    ev = api_evictor(fake, conn, DecisionLog())
    pod = seeded_pod(fake)
    assert await ev.evict(pod, REASON, MESSAGE, "MemoryEvict")
    fake.upsert("pods", make_pod("p1", NODE, uid=pod.uid))  # still terminating: visible again
    for _ in range(3):
        assert await ev.evict(pod, REASON, MESSAGE, "MemoryEvict") is True
    assert len(fake.evictions) == 1
    assert len(fake.events) == 1


async def test_concurrent_evictions_of_one_pod_call_the_api_once(
    fake: FakeAPIServer, conn: KubeConnection
) -> None:
    """CPUEvict and MemoryEvict run on separate tasks: both may pick the same pod in the same moment."""
    ev = api_evictor(fake, conn, DecisionLog())
    pod = seeded_pod(fake)
    results = await asyncio.gather(
        ev.evict(pod, REASON, MESSAGE, "CPUEvict"),
        ev.evict(pod, REASON, MESSAGE, "MemoryEvict"),
        ev.evict(pod, REASON, MESSAGE, "MemoryEvict"),
    )
    assert results == [True, True, True]
    assert len(fake.evictions) == 1
    assert [e["reason"] for e in fake.events] == ["evictPodSuccess"]


async def test_concurrent_callers_see_a_failure_and_retry_later(
    fake: FakeAPIServer, conn: KubeConnection
) -> None:
    clock = FakeClock()
    ev = api_evictor(fake, conn, DecisionLog(), clock=clock)
    pod = seeded_pod(fake)
    fake.block_eviction("default", "p1")
    results = await asyncio.gather(
        ev.evict(pod, REASON, MESSAGE, "CPUEvict"), ev.evict(pod, REASON, MESSAGE, "MemoryEvict")
    )
    assert results == [False, False]
    assert len(fake.evictions) == 1
    fake.block_eviction("default", "p1", blocked=False)
    clock.now += 1.0  # past the pod's back-off
    assert await ev.evict(pod, REASON, MESSAGE, "MemoryEvict") is True


async def test_pdb_429_is_a_failure_and_is_retried_later(fake: FakeAPIServer, conn: KubeConnection) -> None:
    decisions = DecisionLog()
    clock = FakeClock()
    ev = api_evictor(fake, conn, decisions, clock=clock)
    pod = seeded_pod(fake)
    fake.block_eviction("default", "p1")
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is False
    assert not ev.is_evicted(pod)
    assert fake.get("pods", "p1") is not None
    assert fake.events[-1]["reason"] == "evictPodFail"
    assert fake.events[-1]["message"].startswith(
        f"evict Pod:default/p1, reason: {REASON}, message: {MESSAGE}, error "
    )
    assert "disruption budget" in fake.events[-1]["message"]
    assert decisions.recent()[-1].action == "evict-failed"
    # a round after the back-off tries again (nothing cached), and succeeds once the budget allows it
    clock.now += 1.0
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is False
    fake.block_eviction("default", "p1", blocked=False)
    clock.now += 2.0
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is True
    assert [e["status"] for e in fake.evictions] == [429, 429, 201]


async def test_missing_pod_404_fails_with_an_event(fake: FakeAPIServer, conn: KubeConnection) -> None:
    ev = api_evictor(fake, conn, DecisionLog())
    pod = PodInfo(uid="gone-uid", namespace="default", name="gone")
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is False
    assert fake.evictions[-1]["status"] == 404
    assert fake.events[-1]["reason"] == "evictPodFail"
    assert "pod not found" in fake.events[-1]["message"]
    assert not ev.is_evicted(pod)


async def test_uid_precondition_protects_a_recreated_pod(fake: FakeAPIServer, conn: KubeConnection) -> None:
    ev = api_evictor(fake, conn, DecisionLog())
    old = seeded_pod(fake)
    fake.delete("pods", "p1")
    fake.upsert("pods", make_pod("p1", NODE, uid="new-uid"))  # same name, different pod
    assert await ev.evict(old, REASON, MESSAGE, "CPUEvict") is False
    assert fake.evictions[-1]["status"] == 409
    assert fake.get("pods", "p1") is not None


async def test_api_unreachable_is_a_failure_not_an_exception(
    fake: FakeAPIServer, conn: KubeConnection
) -> None:
    ev = api_evictor(fake, conn, DecisionLog())
    pod = seeded_pod(fake)
    await conn.get()
    await fake.stop()
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is False
    assert not ev.is_evicted(pod)


async def test_dry_run_records_and_calls_nothing(fake: FakeAPIServer, conn: KubeConnection) -> None:
    decisions = DecisionLog(dry_run=True)
    ev = api_evictor(fake, conn, decisions, dry_run=True)
    pod = seeded_pod(fake)
    assert await ev.evict(pod, REASON, MESSAGE, "MemoryEvict") is True
    assert fake.evictions == []
    assert fake.events == []
    assert fake.get("pods", "p1") is not None
    (d,) = decisions.recent()
    assert (d.strategy, d.target, d.action, d.dry_run) == ("MemoryEvict", "default/p1", "evict", True)
    assert await ev.evict(pod, REASON, MESSAGE, "MemoryEvict") is True
    assert len(decisions) == 1  # cached like a real eviction


async def test_local_mode_evictions_are_decisions_only() -> None:
    decisions = DecisionLog()
    ev = Evictor(decisions, None, None, qps=5)
    pod = PodInfo(uid="u", namespace="ns", name="p")
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is True
    (d,) = decisions.recent()
    assert d.action == "evict"
    assert d.dry_run is True
    assert "local mode" in d.reason


def test_evicted_cache_expires_after_the_ttl() -> None:
    now = [1000.0]
    cache = EvictedCache(ttl=120, clock=lambda: now[0])
    cache.add("a")
    now[0] += 119
    assert "a" in cache
    now[0] += 2
    assert "a" not in cache
    assert len(cache) == 0


async def test_rate_limit_waits_for_tokens() -> None:
    now = [0.0]
    slept: list[float] = []

    async def fake_sleep(delay: float) -> None:
        slept.append(delay)
        now[0] += delay

    bucket = TokenBucket(qps=2, burst=2, clock=lambda: now[0], sleep=fake_sleep)
    for _ in range(2):
        await bucket.acquire()
    assert slept == []
    await bucket.acquire()
    await bucket.acquire()
    assert slept == [pytest.approx(0.5), pytest.approx(0.5)]


async def test_pdb_blocked_pods_are_backed_off_not_hammered(
    fake: FakeAPIServer, conn: KubeConnection
) -> None:
    """5 PDB-blocked pods asked every second for 40 s: a few POSTs and Events each, not 40; then once each."""
    clock = FakeClock()
    ev = api_evictor(fake, conn, DecisionLog(), clock=clock)
    pods = [seeded_pod(fake, f"p{i}") for i in range(5)]
    for p in pods:
        fake.block_eviction("default", p.name)
    for _ in range(40):
        for p in pods:
            assert await ev.evict(p, REASON, MESSAGE, "CPUEvict") is False
        clock.now += 1.0
    posts = {p.name: sum(1 for e in fake.evictions if e["name"] == p.name) for p in pods}
    # attempts at t = 0, 1, 3, 7, 15, 31 (1 s doubling): 6 each, where one per second would be 40
    assert posts == {p.name: 6 for p in pods}
    fails = [e for e in fake.events if e["reason"] == "evictPodFail"]
    assert len(fails) == 5 * 6  # one Event per back-off step
    for p in pods:
        fake.block_eviction("default", p.name, blocked=False)
    clock.now += 60.0
    for _ in range(3):
        for p in pods:
            assert await ev.evict(p, REASON, MESSAGE, "CPUEvict") is True
    assert sum(1 for e in fake.evictions if e["status"] == 201) == 5  # each evicted exactly once


async def test_a_changed_pod_starts_its_back_off_afresh(fake: FakeAPIServer, conn: KubeConnection) -> None:
    clock = FakeClock()
    ev = api_evictor(fake, conn, DecisionLog(), clock=clock)
    pod = seeded_pod(fake)
    fake.block_eviction("default", "p1")
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is False
    assert await ev.evict(pod, REASON, MESSAGE, "CPUEvict") is False  # backed off: no call
    assert len(fake.evictions) == 1
    changed = pod.model_copy(update={"resource_version": pod.resource_version + "1"})
    fake.block_eviction("default", "p1", blocked=False)
    assert await ev.evict(changed, REASON, MESSAGE, "CPUEvict") is True
    assert [e["status"] for e in fake.evictions] == [429, 201]


def test_back_off_doubles_up_to_the_cap() -> None:
    clock = FakeClock()
    bo = EvictionBackoff(base=1.0, cap=8.0, clock=clock)
    pod = PodInfo(uid="u", namespace="n", name="p", resource_version="7")
    assert [bo.failed(pod) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert bo.waiting(pod)
    clock.now += 8.0
    assert not bo.waiting(pod)
    bo.succeeded(pod)
    assert bo.failed(pod) == 1.0


def test_the_pod_label_is_bounded_to_the_last_pods_evicted() -> None:
    """koordqos_pod_evictions_total keeps series for the last `limit` pods only: a node evicting for days
    does not grow /metrics without bound; a pod evicted again becomes the newest."""
    from koordqos.kube.evictor import EvictionSeries

    series = EvictionSeries(limit=3)

    def value(pod: str, result: str = "success") -> float | None:
        return obs.REGISTRY.get_sample_value(
            "koordqos_pod_evictions_total",
            {"reason": "bounded", "result": result, "namespace": "ns-bounded", "pod": pod},
        )

    for name in ("a", "b", "c"):
        series.inc("bounded", "success", "ns-bounded", name)
    series.inc("bounded", "failed", "ns-bounded", "a")  # a again: the newest now
    series.inc("bounded", "success", "ns-bounded", "d")  # b, the oldest, goes
    assert len(series) == 3
    assert value("b") is None
    assert value("a") == 1.0
    assert value("a", "failed") == 1.0
    assert value("c") == 1.0
    assert value("d") == 1.0
    series.inc("bounded", "success", "ns-bounded", "e")  # c goes
    assert value("c") is None
    assert value("a", "failed") == 1.0
