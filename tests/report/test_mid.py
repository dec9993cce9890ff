"""koord-manager's Mid formula (docs/prediction.md, "Mid formula"): the upstream plugin's test vectors.

Test node: capacity 100 cores / 210G, allocatable 100 / 200G (kubelet reserved 0 / 10G); pods: prod LS
20 cores / 40G and batch BE 15 / 30G, both Running."""

from __future__ import annotations

from typing import Any

import pytest

from koordqos.report.batch import BatchStrategy, needs_sync
from koordqos.report.format import rfc3339
from koordqos.report.mid import MidNode, MidPod, MidStrategy, calculate, degraded

G = 10**9
NODE = MidNode({"cpu": 100_000, "memory": 210 * G}, {"cpu": 100_000, "memory": 200 * G})
PODS = [
    MidPod("koord-prod", "Running", {"cpu": 20_000, "memory": 40 * G}),
    MidPod("koord-batch", "Running", {"cpu": 15_000, "memory": 30 * G}),
]
NOW = 1767225600.0


def rm(cpu_cores: float, mem: int) -> dict[str, Any]:
    return {"resources": {"cpu": f"{int(cpu_cores * 1000)}m", "memory": str(mem)}}


def status(
    usage: tuple[float, int] | None, reclaim: tuple[float, int] | str | None, **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"updateTime": rfc3339(NOW), "nodeMetric": {}}
    if usage is not None:
        out["nodeMetric"]["nodeUsage"] = rm(*usage)
    if reclaim == "empty":
        out["prodReclaimableMetric"] = {"resource": {}}
    elif isinstance(reclaim, tuple):
        out["prodReclaimableMetric"] = {"resource": rm(*reclaim)}
    return out | extra


def test_valid() -> None:
    r = calculate(NODE, PODS, status((20, 45 * G), (10, 15 * G)))
    assert (r.mid_cpu, r.mid_memory) == (10_000, 15 * G)
    assert r.detail["unused"] == {"cpu": 80_000, "memory": 165 * G}
    assert r.detail["unallocated"] == {"cpu": 80_000, "memory": 160 * G}


def test_exceeds_the_thresholds() -> None:
    s = MidStrategy(mid_cpu_threshold_percent=10, mid_memory_threshold_percent=20, mid_unallocated_percent=10)
    r = calculate(NODE, PODS, status((30, 50 * G), (15, 30 * G)), s)
    assert (r.mid_cpu, r.mid_memory) == (10_000, 42 * G)  # 15000 + 8000 → 10000; 30G + 16G → 42G


def test_empty_reclaimable_is_zero() -> None:
    r = calculate(NODE, PODS, status((30, 50 * G), "empty"))
    assert (r.mid_cpu, r.mid_memory) == (0, 0)


@pytest.mark.parametrize(("static", "want"), [(10, (10_000, 21 * G)), (100, (10_000, 42 * G))])
def test_static_mode(static: int, want: tuple[int, int]) -> None:
    s = MidStrategy(
        mid_reclaim_mode="static",
        mid_static_cpu_reserved_percent=static,
        mid_static_memory_reserved_percent=static,
        mid_cpu_threshold_percent=10,
        mid_memory_threshold_percent=20,
    )
    r = calculate(NODE, PODS, status(None, None), s)
    assert (r.mid_cpu, r.mid_memory) == want


def test_no_node_usage_means_nothing_unused() -> None:
    r = calculate(NODE, PODS, status(None, (20, 20 * G)))
    assert (r.mid_cpu, r.mid_memory) == (0, 0)


def test_reclaimable_above_what_is_free() -> None:
    r = calculate(NODE, PODS, status((90, 200 * G), (20, 20 * G)))
    assert (r.mid_cpu, r.mid_memory) == (10_000, 10 * G)


def test_prod_host_applications_count_as_system_usage() -> None:
    app = {"name": "a", "priority": "koord-prod", "usage": rm(5, 15 * G)}
    r = calculate(NODE, PODS, status((30, 50 * G), None, hostApplicationMetric=[app]))
    assert (r.mid_cpu, r.mid_memory) == (0, 0)
    assert r.detail["unallocated"] == {"cpu": 75_000, "memory": 155 * G}


@pytest.mark.parametrize("priority", ["koord-mid", "koord-batch"])
def test_mid_or_batch_host_applications_do_not(priority: str) -> None:
    app = {"name": "a", "priority": priority, "usage": rm(5, 15 * G)}
    r = calculate(NODE, PODS, status((30, 50 * G), None, hostApplicationMetric=[app]))
    assert r.detail["unallocated"] == {"cpu": 80_000, "memory": 160 * G}


def test_pods_not_running_or_pending_are_not_allocated() -> None:
    pods = [*PODS, MidPod("koord-prod", "Succeeded", {"cpu": 50_000, "memory": 50 * G})]
    pods.append(MidPod("koord-mid", "Running", {"cpu": 50_000, "memory": 50 * G}))
    r = calculate(NODE, pods, status((20, 45 * G), (10, 15 * G)))
    assert r.detail["prodAllocated"] == {"cpu": 20_000, "memory": 40 * G}


def test_degrade() -> None:
    five = MidStrategy(degrade_time_minutes=5)
    assert degraded(None, NOW)
    assert degraded({}, NOW)
    assert degraded({"updateTime": rfc3339(NOW - 30 * 60)}, NOW, five)
    assert not degraded({"updateTime": rfc3339(NOW)}, NOW, five)  # no prodReclaimableMetric: not a reason
    assert not degraded(status((20, 45 * G), (10, 15 * G)), NOW)
    assert not degraded({"updateTime": rfc3339(NOW - 15 * 60)}, NOW)  # strictly later than 15 min


def test_need_sync() -> None:
    s = BatchStrategy(update_time_threshold_seconds=300, resource_diff_threshold=0.1)
    mid = {"kubernetes.io/mid-cpu": 20_000}
    assert not needs_sync(mid, {"kubernetes.io/mid-cpu": 20_000}, 10.0, s)
    assert needs_sync(mid, {"kubernetes.io/mid-cpu": 22_001}, 10.0, s)
    assert needs_sync(mid, {"kubernetes.io/mid-cpu": 20_000}, 301.0, s)
