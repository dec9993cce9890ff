"""Memory evict: koordlet's test cases 1–8 (same inputs, same outputs; docs/behaviour-qos-manager.md,
"Memory evict")."""

from __future__ import annotations

import pytest

from koordqos.model.keys import BATCH_MEMORY, MID_MEMORY
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.strategies.cpuevict import allocatable_release
from koordqos.strategies.eviction import EvictTask, kill_and_evict_sync, sort_by_priority
from koordqos.strategies.memoryevict import MemoryEvictInputs, plan_memory_evict, used_threshold_release
from koordqos.strategies.thresholds import check_memory_allocatable, check_memory_common, check_memory_used

from .conftest import Gi, make_node, make_pod, make_slo, make_store

G = 10**9
NODE = make_node(80, 120 * G)
ENABLED = {"koordinator.sh/eviction-enabled": "true"}


def test_case1_release() -> None:
    assert used_threshold_release(120 * G, 115 * G, 80, 78) == 20_400_000_000
    assert used_threshold_release(120 * G, 115 * G, 80, 80) == 18_000_000_000
    assert used_threshold_release(120 * G, 80 * G, 80, 78) == 0


def _run(
    pods: list[PodInfo],
    used: dict[str, float],
    gates: dict[str, bool],
    node_used: float = 115 * G,
    node: object = NODE,
    **threshold: object,
) -> list[str]:
    slo = make_slo(enable=True, **threshold)
    store = make_store(node_memory=node_used, pod_memory=used)
    plan = plan_memory_evict(MemoryEvictInputs(tuple(pods), node, slo, gates, store))  # type: ignore[arg-type]
    evicted: list[str] = []

    def evict(task: EvictTask, pod: PodInfo) -> bool:
        evicted.append(pod.name)
        return True

    kill_and_evict_sync(plan.tasks, lambda p: False, evict)
    return evicted


def _be_pods() -> tuple[list[PodInfo], dict[str, float]]:
    pods = [
        make_pod("be-100-5g", "BE", 100),
        make_pod("be-100-20g", "BE", 100),
        make_pod("be-120-10g", "BE", 120),
        make_pod("lsr", "LSR", 9000, kube_qos=KubeQoS.GUARANTEED),
        make_pod("ls", "LS", 9000, kube_qos=KubeQoS.BURSTABLE),
        make_pod("none", None, 100, kube_qos=KubeQoS.BURSTABLE),
    ]
    used = {
        "be-100-5g": 5 * G,
        "be-100-20g": 20 * G,
        "be-120-10g": 10 * G,
        "lsr": 30 * G,
        "ls": 30 * G,
        "none": 30 * G,
    }
    return pods, used


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [
        ({"memoryEvictThresholdPercent": 82}, ["be-100-20g"]),
        ({"memoryEvictThresholdPercent": 80}, ["be-100-20g", "be-100-5g"]),
        ({"memoryEvictThresholdPercent": 50}, ["be-100-20g", "be-100-5g", "be-120-10g"]),
        ({"memoryEvictThresholdPercent": 82, "memoryEvictLowerPercent": 80}, ["be-100-20g"]),
        ({"memoryEvictThresholdPercent": 82, "memoryEvictLowerPercent": 78}, ["be-100-20g", "be-100-5g"]),
        (
            {"memoryEvictThresholdPercent": 82, "memoryEvictLowerPercent": 74},
            ["be-100-20g", "be-100-5g", "be-120-10g"],
        ),
    ],
)
def test_case2_be_memory_evict(threshold: dict[str, int], expected: list[str]) -> None:
    pods, used = _be_pods()
    assert _run(pods, used, {"BEMemoryEvict": True}, **threshold) == expected


def test_case3_under_evict_line() -> None:
    pods, used = _be_pods()
    assert _run(pods, used, {"BEMemoryEvict": True}, node_used=80 * G, memoryEvictThresholdPercent=80) == []


def _batch(name: str, request: int, priority: int = 5000) -> PodInfo:
    return make_pod(name, "BE", priority, {BATCH_MEMORY: request}, labels=ENABLED)


def test_case4_allocatable_without_node_allocatable() -> None:
    pods = [_batch("batch-1", 20 * Gi), _batch("batch-2", 30 * Gi)]
    got = _run(
        pods,
        {},
        {"MemoryAllocatableEvict": True},
        memoryAllocatableEvictThresholdPercent=80,
        memoryAllocatableEvictLowerPercent=70,
        allocatableEvictPriorityThreshold=5000,
    )
    assert got == ["batch-2", "batch-1"]


def test_case5_allocatable_ledger() -> None:
    node = make_node(80, 120 * G, allocatable={BATCH_MEMORY: 100 * Gi})
    both = make_node(80, 120 * G, allocatable={BATCH_MEMORY: 100 * Gi, MID_MEMORY: 100 * Gi})
    mid = make_pod("mid", "LS", 7000, {"memory": 85 * Gi, MID_MEMORY: 85 * Gi}, kube_qos=KubeQoS.BURSTABLE)
    assert allocatable_release(
        [_batch("a", 45 * Gi), _batch("b", 40 * Gi)], node, "memory", 80, 70, 7999
    ) == {BATCH_MEMORY: 16106127360}
    pods = [_batch("a", 85 * Gi), mid]
    assert allocatable_release(pods, both, "memory", 80, 70, 7999) == {
        BATCH_MEMORY: 16106127360,
        MID_MEMORY: 16106127360,
    }
    assert allocatable_release(pods, both, "memory", 80, 70, 5999) == {BATCH_MEMORY: 16106127360}
    assert allocatable_release([_batch("a", 50 * Gi)], node, "memory", 0, 0, 7999) == {
        BATCH_MEMORY: 53687091200
    }
    assert allocatable_release([_batch("a", 50 * Gi)], NODE, "memory", 80, 70, 7999) == {
        BATCH_MEMORY: 53687091200
    }
    assert (
        allocatable_release([_batch("a", 20 * Gi), _batch("b", 30 * Gi)], node, "memory", 80, 70, 7999) == {}
    )


def test_case6_all_three_features() -> None:
    node = make_node(80, 120 * G, allocatable={BATCH_MEMORY: 100 * Gi})
    pods, used = _be_pods()
    pods += [_batch("batch-pod-1", 20 * Gi), _batch("batch-pod-2", 30 * Gi)]
    used |= {"batch-pod-1": 1 * G, "batch-pod-2": 1 * G}
    got = _run(
        pods,
        used,
        {"BEMemoryEvict": True, "MemoryAllocatableEvict": True, "MemoryEvict": True},
        node=node,
        memoryEvictThresholdPercent=82,
        memoryEvictLowerPercent=74,
        memoryAllocatableEvictThresholdPercent=45,
        memoryAllocatableEvictLowerPercent=40,
        allocatableEvictPriorityThreshold=5000,
        evictEnabledPriorityThreshold=3000,
    )
    assert got == ["be-100-20g", "be-100-5g", "be-120-10g", "batch-pod-2"]


def test_case7_priority_sort() -> None:
    pods = [
        make_pod("failed", "BE", 100, labels=ENABLED, phase="Failed"),
        make_pod("disabled", "BE", 100, labels={"koordinator.sh/eviction-enabled": "false"}),
        make_pod("p3400", "LS", 3400, labels=ENABLED, kube_qos=KubeQoS.BURSTABLE),
        make_pod("p120-2000", "BE", 120, labels={**ENABLED, "koordinator.sh/priority": "2000"}),
        make_pod("p120-3000", "BE", 120, labels={**ENABLED, "koordinator.sh/priority": "3000"}),
        make_pod("p120-4000", "BE", 120, labels={**ENABLED, "koordinator.sh/priority": "4000"}),
        make_pod("p100-10g", "BE", 100, labels=ENABLED),
        make_pod("p100-11g", "BE", 100, labels=ENABLED),
    ]
    used = {p.uid: 1.0 * G for p in pods} | {"p100-10g": 10 * G, "p100-11g": 11 * G}
    slo = make_slo(enable=True, memoryEvictThresholdPercent=80, evictEnabledPriorityThreshold=3000)
    store = make_store(node_memory=115 * G, pod_memory=used)
    plan = plan_memory_evict(MemoryEvictInputs(tuple(pods), NODE, slo, {"MemoryEvict": True}, store))
    assert [p.name for p in plan.tasks[0].pods] == [
        "p100-11g",
        "p100-10g",
        "p120-2000",
        "p120-3000",
        "p120-4000",
    ]
    # a victim releases its real usage in bytes (project decision: no ×1000)
    assert plan.tasks[0].pod_resource(pods[-1]) == {"memory": 11 * G}


def test_case7_eviction_priority_annotation() -> None:
    def pod(name: str, prio: int, ann: str | None) -> PodInfo:
        annotations = {} if ann is None else {"koordinator.sh/eviction-priority": ann}
        return make_pod(name, "BE", prio, labels=ENABLED, annotations=annotations)

    pods = [
        pod("p100", 100, "100"),
        pod("invalid", 120, "x"),
        pod("unset", 100, None),
        pod("minus", 100, "-1"),
    ]
    infos = sort_by_priority(pods, "MemoryEvict", 3000, lambda p, b: b, lambda i: 0)
    assert [i.pod.name for i in infos] == ["minus", "unset", "invalid", "p100"]


def test_case8_config_check() -> None:
    t = make_slo(memoryEvictThresholdPercent=80, memoryEvictLowerPercent=90).resource_used_threshold_with_be
    assert check_memory_common(t) == "lower percent(90) should less than threshold percent(80)"
    t = make_slo(memoryEvictThresholdPercent=80, memoryEvictLowerPercent=80).resource_used_threshold_with_be
    assert check_memory_common(t) == "lower percent(80) should less than threshold percent(80)"
    t = make_slo(
        memoryAllocatableEvictThresholdPercent=80,
        memoryAllocatableEvictLowerPercent=70,
        allocatableEvictPriorityThreshold=8000,
    ).resource_used_threshold_with_be
    assert check_memory_allocatable(t) == (
        "priorityThresholdPercent(8000) should less than 7999, koor-prod pods should not be killed"
    )
    ok = make_slo(
        memoryEvictThresholdPercent=85, memoryEvictLowerPercent=75, evictEnabledPriorityThreshold=5999
    ).resource_used_threshold_with_be
    assert check_memory_used(ok) is None


def test_invalid_config_skips_feature() -> None:
    pods, used = _be_pods()
    slo = make_slo(enable=True, memoryEvictThresholdPercent=80, memoryEvictLowerPercent=90)
    store = make_store(node_memory=115 * G, pod_memory=used)
    plan = plan_memory_evict(MemoryEvictInputs(tuple(pods), NODE, slo, {"BEMemoryEvict": True}, store))
    assert plan.tasks == []
    assert plan.invalid == {"BEMemoryEvict": "lower percent(90) should less than threshold percent(80)"}


def test_nodeslo_switch_off_or_missing() -> None:
    pods, used = _be_pods()
    store = make_store(node_memory=115 * G, pod_memory=used)
    off = make_slo(enable=False, memoryEvictThresholdPercent=50)
    assert (
        plan_memory_evict(MemoryEvictInputs(tuple(pods), NODE, off, {"BEMemoryEvict": True}, store)).tasks
        == []
    )
    plan = plan_memory_evict(MemoryEvictInputs(tuple(pods), NODE, None, {"BEMemoryEvict": True}, store))
    assert plan.tasks == []
    assert plan.skipped["BEMemoryEvict"]
