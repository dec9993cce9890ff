"""The batch worked example (docs/reporting.md, "Batch formula"): the agent's report for the worked load,
through the manager's formula."""

from __future__ import annotations

from typing import Any

import pytest

from koordqos.report.batch import (
    BatchStrategy,
    ManagedPod,
    NodeCapacity,
    calculate,
    degraded,
    needs_sync,
)
from koordqos.report.history import ReportHistory
from koordqos.report.nodemetric import PodMeta, build_status
from koordqos.report.policy import CollectPolicy

from .conftest import FakeClock, GiB, feed, snapshot

WALL = 1796149800.0
NODE = NodeCapacity(
    capacity={"cpu": 16000, "memory": 64 * GiB}, allocatable={"cpu": 15000, "memory": 62 * GiB}
)
# the agent's pods (old-0 is still known to the agent: deleted, series in the window)
AGENT_PODS = [
    PodMeta("u-web", "default", "web-0", "koord-prod", "LS"),
    PodMeta("u-db", "default", "db-0", "koord-prod", "LSR"),
    PodMeta("u-spark", "batch", "spark-1", "koord-batch", "BE"),
    PodMeta("u-new", "default", "new-0", "koord-prod", "LS"),
    PodMeta("u-old", "default", "old-0", "koord-prod", "LS"),
]
# the manager's pod list: Running/Pending pods; old-0 is gone
MANAGER_PODS = [
    ManagedPod("default", "web-0", "koord-prod", "LS", {"cpu": 4000, "memory": 8 * GiB}),
    ManagedPod("default", "db-0", "koord-prod", "LSR", {"cpu": 2000, "memory": 4 * GiB}),
    ManagedPod("batch", "spark-1", "koord-batch", "BE", {}),
    ManagedPod("default", "new-0", "koord-prod", "LS", {"cpu": 1000, "memory": 2 * GiB}),
]
LOAD = snapshot(
    8.0,
    13 * GiB,
    {
        "u-web": (1.5, 4 * GiB),
        "u-db": (1.8, 3 * GiB),
        "u-spark": (3.0, 2 * GiB),
        "u-old": (0.5, 1 * GiB),
        # new-0 just started: no sample yet
    },
)


def worked_status() -> dict[str, Any]:
    clock = FakeClock()
    history = ReportHistory(1.0, clock=clock)
    feed(history, clock, 360, LOAD)
    status = build_status(history, CollectPolicy(), AGENT_PODS, [], WALL)
    assert isinstance(status, dict)
    return status


def test_report_for_the_worked_load() -> None:
    status = worked_status()
    assert status["nodeMetric"]["systemUsage"] == {"resources": {"cpu": "1200m", "memory": "3Gi"}}
    names = [p["name"] for p in status["podsMetric"]]
    assert names == ["spark-1", "db-0", "old-0", "web-0"]  # new-0 has no samples: omitted
    old = next(p for p in status["podsMetric"] if p["name"] == "old-0")
    assert old["priority"] == "koord-prod"


def test_manager_formula_gives_the_spec_values() -> None:
    result = calculate(NODE, MANAGER_PODS, worked_status())
    assert result.batch_cpu == 3600
    assert result.batch_memory == 30709016167
    d = result.detail
    assert d["safetyMargin"] == {"cpu": 6400, "memory": 24051816857}
    assert d["hpRequest"] == {"cpu": 7000, "memory": 14 * GiB}
    assert d["hpUsed"] == {"cpu": 4800, "memory": 10 * GiB}
    assert d["hpMaxUsedRequest"] == {"cpu": 6500, "memory": 13 * GiB}
    assert d["systemUsed"] == {"cpu": 1200, "memory": 3221225472}


@pytest.mark.parametrize(
    ("strategy", "cpu", "memory"),
    [
        (BatchStrategy(cpu_calculate_policy="maxUsageRequest"), 1900, 30709016167),
        (BatchStrategy(memory_calculate_policy="request"), 3600, 27487790695),
        (BatchStrategy(memory_calculate_policy="maxUsageRequest"), 3600, 27487790695),
        (BatchStrategy(batch_cpu_threshold_percent=20), 3200, 30709016167),
    ],
)
def test_policy_variants(strategy: BatchStrategy, cpu: int, memory: int) -> None:
    result = calculate(NODE, MANAGER_PODS, worked_status(), strategy)
    assert (result.batch_cpu, result.batch_memory) == (cpu, memory)


def test_lse_pod_counts_its_cpu_request() -> None:
    status = worked_status()
    pods = [
        p if p.name != "db-0" else ManagedPod("default", "db-0", "koord-prod", "LSE", p.request)
        for p in MANAGER_PODS
    ]
    result = calculate(NODE, pods, status)
    assert result.detail["hpUsed"]["cpu"] == 4800 - 1800 + 2000


def test_degrade_after_fifteen_minutes_without_report() -> None:
    status = worked_status()
    assert not degraded(status, WALL + 14 * 60, BatchStrategy())
    assert degraded(status, WALL + 15 * 60, BatchStrategy())
    assert degraded({}, WALL, BatchStrategy())
    assert degraded({"updateTime": "garbage"}, WALL, BatchStrategy())


def test_needs_sync_threshold() -> None:
    old = {"cpu": 3600, "memory": 100}
    assert not needs_sync(old, {"cpu": 3900, "memory": 100}, 10.0)
    assert needs_sync(old, {"cpu": 4000, "memory": 100}, 10.0)
    assert needs_sync(old, old, 300.0)
    assert needs_sync(None, old, None)
