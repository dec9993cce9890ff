"""CPU evict: koordlet's test cases 1–10 (same inputs, same outputs; docs/behaviour-qos-manager.md,
"CPU evict")."""

from __future__ import annotations

import json

import pytest

from koordqos.config import build_config
from koordqos.metrics.types import MetricKind
from koordqos.model.keys import BATCH_CPU, MID_CPU
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.strategies.cpuevict import (
    BECPUValues,
    CPUEvictInputs,
    CPUEvictStrategy,
    allocatable_release,
    be_satisfaction_release,
    node_usage_release,
    plan_cpu_evict,
)
from koordqos.strategies.eviction import (
    EvictTask,
    kill_and_evict_sync,
    sort_be_pods_for_cpu,
    sort_by_priority,
)

from .conftest import NOW, make_node, make_pod, make_slo, make_store

ENABLED = {"koordinator.sh/eviction-enabled": "true"}


def test_case1_be_satisfaction_release() -> None:
    def rel(avg: tuple[int, int, int], cur: tuple[int, int, int]) -> int:
        return be_satisfaction_release(
            BECPUValues(avg[1], avg[2], avg[0]), BECPUValues(cur[1], cur[2], cur[0]), 30, 40, 90
        )

    # tuples are (limit, used, request)
    assert rel((10000, 9500, 50000), (14000, 13000, 50000)) == 6000
    assert rel((13000, 12000, 50000), (11000, 10000, 50000)) == 7000
    assert rel((20000, 19000, 40000), (20000, 19000, 40000)) == 0  # rate 0.5
    assert rel((20000, 10000, 50000), (20000, 10000, 50000)) == 0  # 50 % usage
    assert rel((0, 9500, 50000), (14000, 13000, 50000)) == 0  # limit 0
    assert rel((10000, 9500, 0), (14000, 13000, 50000)) == 0  # request 0
    assert rel((10000, 9500, 50000), (10000, 5000, 50000)) == 0  # current usage too low


def _be_store(avg: tuple[float, float, float], cur: tuple[float, float, float]) -> object:
    """BE series: two samples averaging `avg`, the newest equal to `cur` (limit, used, request)."""
    store = make_store()
    for kind, a, c in zip(
        (MetricKind.BE_CPU_REAL_LIMIT, MetricKind.BE_CPU_USAGE, MetricKind.BE_CPU_REQUEST),
        avg,
        cur,
        strict=True,
    ):
        store.add(kind, "", 2 * a - c, NOW - 1)
        store.add(kind, "", c, NOW)
    return store


@pytest.mark.parametrize(
    ("policy", "allocatable", "avg", "cur", "expected"),
    [
        ("evictByRealLimit", None, (10000, 6000, 50000), (14000, 8000, 50000), 6000),
        ("evictByRealLimit", None, (20000, 9000, 50000), (20000, 9000, 50000), 0),
        ("evictByRealLimit", 8000, (10000, 6000, 50000), (10000, 4000, 50000), 0),
        ("evictByAllocatable", 8000, (10000, 6000, 50000), (10000, 4000, 50000), 12000),
        ("evictByAllocatable", 0, (10000, 6000, 50000), (10000, 4000, 50000), 19999),
    ],
)
def test_case2_usage_threshold_and_policy(
    policy: str, allocatable: int | None, avg: tuple[int, int, int], cur: tuple[int, int, int], expected: int
) -> None:
    node = make_node(100, allocatable={BATCH_CPU: allocatable} if allocatable is not None else None)
    slo = make_slo(
        enable=True,
        cpuEvictBESatisfactionLowerPercent=30,
        cpuEvictBESatisfactionUpperPercent=40,
        cpuEvictBEUsageThresholdPercent=50,
        cpuEvictTimeWindowSeconds=3,
        cpuEvictPolicy=policy,
    )
    inp = CPUEvictInputs(
        (make_pod("be", "BE", 100, {BATCH_CPU: 16000}),),
        node,
        slo,
        {"BECPUEvict": True},
        _be_store(avg, cur),
        1.0,
    )  # type: ignore[arg-type]
    plan = plan_cpu_evict(inp)
    got = plan.tasks[0].to_release[BATCH_CPU] if plan.tasks else 0
    assert got == expected


def test_be_satisfaction_needs_enough_samples() -> None:
    slo = make_slo(
        enable=True,
        cpuEvictBESatisfactionLowerPercent=30,
        cpuEvictBESatisfactionUpperPercent=40,
        cpuEvictTimeWindowSeconds=30,
    )
    store = _be_store((10000, 9500, 50000), (14000, 13000, 50000))  # 2 samples × 1 s < 30 // 3
    inp = CPUEvictInputs((), make_node(100), slo, {"BECPUEvict": True}, store, 1.0)  # type: ignore[arg-type]
    assert plan_cpu_evict(inp).tasks == []


def test_case3_be_sort() -> None:
    pods = [
        make_pod("p100-3", "BE", 100, {BATCH_CPU: 16000}),
        make_pod("p100-4", "BE", 100, {BATCH_CPU: 16000}),
        make_pod("p10-4", "BE", 10, {BATCH_CPU: 16000}),
        make_pod("ls", "LS", 100, {"cpu": 16000}, kube_qos=KubeQoS.BURSTABLE),
        make_pod("lsr", "LSR", 100, {"cpu": 16000}, kube_qos=KubeQoS.GUARANTEED),
    ]
    infos = sort_be_pods_for_cpu(pods, "BECPUEvict", {"p100-3": 3, "p100-4": 4, "p10-4": 4, "ls": 10})
    assert [i.pod.name for i in infos] == ["p10-4", "p100-4", "p100-3"]
    assert [i.cpu_usage for i in infos] == [0.25, 0.25, 0.1875]


def test_case4_node_usage_release() -> None:
    assert node_usage_release(100_000, 81, 80, 78) == 3000
    assert node_usage_release(100_000, 81, 80, 80) == 1000
    assert node_usage_release(100_000, 11, 80, 78) == 0


def _batch(name: str, request: int, priority: int = 5000) -> PodInfo:
    return make_pod(name, "BE", priority, {BATCH_CPU: request}, labels=ENABLED)


def _mid(name: str, request: int, priority: int = 7000) -> PodInfo:
    return make_pod(
        name, "LS", priority, {"cpu": request, MID_CPU: request}, labels=ENABLED, kube_qos=KubeQoS.BURSTABLE
    )


def test_case5_allocatable_ledger() -> None:
    both = make_node(100, allocatable={BATCH_CPU: 100000, MID_CPU: 100000})
    batch_only = make_node(100, allocatable={BATCH_CPU: 100000})
    assert allocatable_release([_batch("a", 45000), _batch("b", 40000)], batch_only, "cpu", 80, 70, 7999) == {
        BATCH_CPU: 15000
    }
    pods = [_batch("a", 85000), _mid("m", 85000)]
    assert allocatable_release(pods, both, "cpu", 80, 70, 7999) == {BATCH_CPU: 15000, MID_CPU: 15000}
    assert allocatable_release(pods, both, "cpu", 80, 70, 5999) == {BATCH_CPU: 15000}
    assert allocatable_release([_batch("a", 85000)], batch_only, "cpu", 0, 0, 7999) == {BATCH_CPU: 85000}
    assert allocatable_release([_batch("a", 85000)], make_node(100), "cpu", 80, 70, 7999) == {
        BATCH_CPU: 85000
    }
    small = make_node(100, allocatable={BATCH_CPU: 100})
    assert allocatable_release([_batch("a", 0), _batch("b", 0)], small, "cpu", 80, 70, 7999) == {}


def _run(inp: CPUEvictInputs) -> list[str]:
    plan = plan_cpu_evict(inp)
    evicted: list[str] = []

    def evict(task: EvictTask, pod: PodInfo) -> bool:
        evicted.append(pod.name)
        return True

    kill_and_evict_sync(plan.tasks, lambda p: False, evict)
    return evicted


def test_case6_cpu_evict_full_loop() -> None:
    pods = [
        make_pod("failed", "BE", 100, labels=ENABLED, phase="Failed"),
        make_pod("lsr", "LSR", 100, kube_qos=KubeQoS.GUARANTEED),
        make_pod("ls-3400", "LS", 3400, labels=ENABLED, kube_qos=KubeQoS.BURSTABLE),
        make_pod("p120-2000", "BE", 120, labels={**ENABLED, "koordinator.sh/priority": "2000"}),
        make_pod("p120-3000", "BE", 120, labels={**ENABLED, "koordinator.sh/priority": "3000"}),
        make_pod("p120-4000", "BE", 120, labels={**ENABLED, "koordinator.sh/priority": "4000"}),
        make_pod("p100-used1", "BE", 100, labels=ENABLED),
        make_pod("p100-used2", "BE", 100, labels=ENABLED),
    ]
    used = {
        "failed": 9,
        "lsr": 9,
        "ls-3400": 9,
        "p120-2000": 1,
        "p120-3000": 5,
        "p120-4000": 2,
        "p100-used1": 1,
        "p100-used2": 2,
    }
    store = make_store(node_cpu=81, pod_cpu=used)
    slo = make_slo(enable=True, cpuEvictThresholdPercent=78, evictEnabledPriorityThreshold=3000)
    inp = CPUEvictInputs(tuple(pods), make_node(100), slo, {"CPUEvict": True}, store, 1.0)
    plan = plan_cpu_evict(inp)
    assert plan.tasks[0].to_release == {"cpu": 5000}
    assert [p.name for p in plan.tasks[0].pods] == [
        "p100-used2",
        "p100-used1",
        "p120-2000",
        "p120-3000",
        "p120-4000",
    ]
    assert _run(inp) == ["p100-used2", "p100-used1", "p120-2000", "p120-3000"]
    assert plan.tasks[0].reason == "trigger by koordlet feature CPUEvict"


def test_case7_allocatable_only() -> None:
    node = make_node(100, allocatable={BATCH_CPU: 100000, MID_CPU: 100000})
    slo = make_slo(
        enable=True,
        cpuAllocatableEvictThresholdPercent=80,
        cpuAllocatableEvictLowerPercent=70,
        allocatableEvictPriorityThreshold=7999,
    )
    pods = (_batch("batch", 85000, 100), _mid("mid", 85000))
    inp = CPUEvictInputs(pods, node, slo, {"CPUAllocatableEvict": True}, make_store(), 1.0)
    assert _run(inp) == ["batch", "mid"]


def test_case8_allocatable_and_usage_without_allocatable() -> None:
    slo = make_slo(
        enable=True,
        cpuAllocatableEvictThresholdPercent=80,
        cpuAllocatableEvictLowerPercent=70,
        allocatableEvictPriorityThreshold=7999,
        cpuEvictThresholdPercent=78,
        evictEnabledPriorityThreshold=7999,
    )
    pods = (
        make_pod("pod-1", "LS", 9500, {"cpu": 1000}, labels=ENABLED, kube_qos=KubeQoS.BURSTABLE),
        *(_batch(f"pod-{i}", 85000 // 4, 5000 + i) for i in range(2, 6)),
        *(_mid(f"pod-{i}", 85000 // 4, 7000 + i) for i in range(6, 10)),
    )
    store = make_store(node_cpu=81, pod_cpu={p.uid: 1 for p in pods})
    inp = CPUEvictInputs(
        pods, make_node(100), slo, {"CPUAllocatableEvict": True, "CPUEvict": True}, store, 1.0
    )
    assert sorted(_run(inp)) == [f"pod-{i}" for i in range(2, 10)]


def test_case9_eviction_priority_order() -> None:
    def pod(name: str, prio: int, ann: str | None) -> PodInfo:
        annotations = {} if ann is None else {"koordinator.sh/eviction-priority": ann}
        return make_pod(name, "BE", prio, labels=ENABLED, annotations=annotations)

    pods = [
        pod("p100", 100, "100"),
        pod("invalid", 120, "x"),
        pod("unset", 100, None),
        pod("minus", 100, "-1"),
    ]
    infos = sort_by_priority(pods, "CPUEvict", 3000, lambda p, b: b, lambda i: 0)
    assert [i.pod.name for i in infos] == ["minus", "unset", "invalid", "p100"]


@pytest.mark.parametrize(
    ("gates", "interval", "expected"),
    [
        ({}, 10, False),
        ({"BECPUEvict": True}, 10, True),
        ({"CPUEvict": True}, 10, True),
        ({"CPUAllocatableEvict": True}, 10, True),
        ({"CPUEvict": True}, -10, False),
    ],
)
def test_case10_enabled(gates: dict[str, bool], interval: float, expected: bool) -> None:
    cfg = build_config({"feature_gates": gates, "qos": {"cpu_evict_interval_seconds": interval}})
    assert CPUEvictStrategy().enabled(cfg) is expected


def test_eviction_policy_annotation_filters_candidates() -> None:
    def pod(name: str, policy: str | None) -> PodInfo:
        ann = {} if policy is None else {"koordinator.sh/eviction-policy": policy}
        return make_pod(name, "BE", 100, labels=ENABLED, annotations=ann)

    pods = [
        pod("absent", None),
        pod("listed", json.dumps(["CPUEvict"])),
        pod("other", '["BEMemoryEvict"]'),
        pod("bad", "{"),
        pod("empty", ""),
        pod("emptylist", "[]"),
        pod("object", '{"a":1}'),
    ]
    infos = sort_by_priority(pods, "CPUEvict", 3000, lambda p, b: b, lambda i: 0)
    assert sorted(i.pod.name for i in infos) == ["absent", "listed"]
