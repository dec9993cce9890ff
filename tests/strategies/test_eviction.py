"""Eviction mechanics: koordlet's test cases (release accounting, pending release, helpers;
docs/behaviour-qos-manager.md, "Eviction")."""

from __future__ import annotations

import pytest

from koordqos.model.keys import BATCH_CPU, MID_CPU
from koordqos.model.pod import PodInfo
from koordqos.strategies.eviction import (
    EvictTask,
    ReleaseTarget,
    evict_task_check,
    kill_and_evict,
    kill_and_evict_sync,
    sub_release_no_negative,
)

from .conftest import make_pod

Mi = 1024**2
Gi = 1024**3


def _evict_all(log: list[str]):  # type: ignore[no-untyped-def]
    def evict(task: EvictTask, pod: PodInfo) -> bool:
        log.append(pod.name)
        return True

    return evict


def test_two_tasks_accumulate_releases() -> None:
    batch1 = make_pod("batch1", "BE", 5000, {BATCH_CPU: 1000})
    batch2 = make_pod("batch2", "BE", 5000, {BATCH_CPU: 500})
    mid = make_pod("mid", "LS", 7000, {MID_CPU: 2000})
    used = {"batch1": 1536 * Mi, "batch2": 768 * Mi, "mid": 3 * Gi}
    requests = {"batch1": {BATCH_CPU: 1000}, "batch2": {BATCH_CPU: 500}, "mid": {MID_CPU: 2000}}
    t1 = EvictTask(
        "MemoryEvict",
        (batch1, batch2),
        ReleaseTarget.POD_USED,
        {"memory": 2 * Gi},
        lambda p: {"memory": used[p.uid]},
    )
    t2 = EvictTask(
        "CPUAllocatableEvict",
        (batch1, batch2, mid),
        ReleaseTarget.POD_RESOURCE_REQUEST,
        {BATCH_CPU: 1200, MID_CPU: 1500},
        lambda p: requests[p.uid],
    )
    evicted: list[str] = []
    out = kill_and_evict_sync([t1, t2], lambda p: False, _evict_all(evicted))
    assert evicted == ["batch1", "batch2", "mid"]
    assert out.released[ReleaseTarget.POD_USED] == {"memory": 2304 * Mi + 3 * Gi}
    assert out.released[ReleaseTarget.POD_RESOURCE_REQUEST] == {BATCH_CPU: 1500, MID_CPU: 2000}
    assert out.newly_evicted


def test_pending_release_of_still_present_pod() -> None:
    old = make_pod("old", "BE", 100)
    other = make_pod("other", "BE", 100)
    used = {"old": 2 * Gi, "other": 2 * Gi}
    task = EvictTask(
        "BEMemoryEvict",
        (old, other),
        ReleaseTarget.POD_USED,
        {"memory": 2 * Gi},
        lambda p: {"memory": used[p.uid]},
    )
    evicted: list[str] = []
    out = kill_and_evict_sync([task], lambda p: p.uid == "old", _evict_all(evicted))
    assert evicted == []
    assert not out.newly_evicted
    assert out.released[ReleaseTarget.POD_USED] == {"memory": 2 * Gi}
    assert [p.name for p in out.pending] == ["old"]

    used["old"] = 1 * Gi
    out = kill_and_evict_sync([task], lambda p: p.uid == "old", _evict_all(evicted))
    assert evicted == ["other"]
    assert out.released[ReleaseTarget.POD_USED] == {"memory": 3 * Gi}


def test_failed_eviction_tries_next_candidate_and_no_pod_twice() -> None:
    a, b, c = (make_pod(n, "BE", 100) for n in "abc")
    t1 = EvictTask("BEMemoryEvict", (a, b, c), ReleaseTarget.POD_USED, {"memory": 2}, lambda p: {"memory": 1})
    t2 = EvictTask("MemoryEvict", (b, c, a), ReleaseTarget.POD_USED, {"memory": 3}, lambda p: {"memory": 1})
    calls: list[str] = []

    def evict(task: EvictTask, pod: PodInfo) -> bool:
        calls.append(pod.name)
        return pod.name != "a"

    out = kill_and_evict_sync([t1, t2], lambda p: False, evict)
    assert calls == ["a", "b", "c", "a"]  # a failed twice: tried again by the second task only
    assert [p.name for _, p in out.evicted] == ["b", "c"]
    assert [p.name for _, p in out.failed] == ["a", "a"]


async def test_async_driver() -> None:
    a = make_pod("a", "BE", 100)
    task = EvictTask("BEMemoryEvict", (a,), ReleaseTarget.POD_USED, {"memory": 1}, lambda p: {"memory": 5})

    async def evict(task: EvictTask, pod: PodInfo) -> bool:
        return True

    out = await kill_and_evict([task], lambda p: False, evict)
    assert [p.name for _, p in out.evicted] == ["a"]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ({"cpu": 500, "memory": 1 * Gi}, {"cpu": 400, "memory": 512 * Mi}, {"cpu": 100, "memory": 512 * Mi}),
        ({"cpu": 400, "memory": 1 * Gi}, {"cpu": 500}, {"memory": 1 * Gi}),
        ({"cpu": -400, "memory": 1 * Gi}, {"memory": 1 * Gi}, {}),
        (None, {"cpu": 1}, {}),
    ],
)
def test_sub_release_no_negative(
    a: dict[str, int] | None, b: dict[str, int], expected: dict[str, int]
) -> None:
    assert sub_release_no_negative(a, b) == expected


def test_evict_task_check() -> None:
    task = EvictTask("CPUEvict", (), ReleaseTarget.POD_USED, {"cpu": 100, "memory": 1 * Gi}, lambda p: {})
    assert evict_task_check(task, None) == (False, {"cpu": 100, "memory": 1 * Gi})
    assert evict_task_check(task, {}) == (False, {"cpu": 100, "memory": 1 * Gi})
    task = EvictTask("CPUEvict", (), ReleaseTarget.POD_USED, {"cpu": 800, "memory": 1 * Gi}, lambda p: {})
    assert evict_task_check(task, {"cpu": 500, "memory": 1 * Gi}) == (False, {"cpu": 300})
    assert evict_task_check(task, {"cpu": 900, "memory": 2 * Gi}) == (True, {})
    assert evict_task_check(None, None) == (True, {})
