"""The NodeMetric status planner: fields, windows, cold start, no status over an empty window
(docs/reporting.md, "Status fields", "System usage per tick", "Missing data" and "No status over an empty
window")."""

from __future__ import annotations

from typing import Any

from koordqos.kube.reportwriters import same_report
from koordqos.model.quantity import to_int, to_milli
from koordqos.report.history import ReportHistory
from koordqos.report.nodemetric import AppMeta, PodMeta, StatusSkipped, build_status
from koordqos.report.policy import CollectPolicy, parse_collect_policy

from .conftest import FakeClock, GiB, feed, snapshot

WALL = 1796149800.0
PODS = [
    PodMeta("u-web", "default", "web-0", "koord-prod", "LS"),
    PodMeta("u-spark", "batch", "spark-1", "koord-batch", "BE"),
    PodMeta("u-none", "default", "idle", "", "LS"),
]


def _history(seconds: int = 400) -> tuple[ReportHistory, FakeClock]:
    clock = FakeClock()
    h = ReportHistory(1.0, clock=clock)
    snap = snapshot(
        4.0,
        10 * GiB,
        {"u-web": (1.5, 4 * GiB), "u-spark": (2.0, 2 * GiB)},
        {"nginx": (0.2, 100 << 20)},
        node_mem_with_cache=12 * GiB,
        pod_file_pages=GiB,
    )
    feed(h, clock, seconds, snap)
    return h, clock


def _res(rm: dict[str, Any]) -> tuple[int, int]:
    r = rm["resources"]
    return to_milli(r["cpu"]), to_int(r["memory"])


def test_full_status_has_every_required_field() -> None:
    h, _ = _history(800)  # 800 s: the 5 and 10 min windows are full, 30 min is still in cold start
    status = build_status(h, CollectPolicy(), PODS, [AppMeta("nginx", "koord-prod", "LS")], WALL)
    assert isinstance(status, dict)
    assert status["updateTime"] == "2026-12-01T18:30:00Z"
    nm = status["nodeMetric"]
    assert _res(nm["nodeUsage"]) == (4000, 10 * GiB)
    # system = node − Σ pods − Σ apps per tick: 4 − 1.5 − 2 − 0.2 cores, 10 − 4 − 2 GiB − 100 MiB
    assert _res(nm["systemUsage"]) == (300, 4 * GiB - (100 << 20))
    assert [a["duration"] for a in nm["aggregatedNodeUsages"]] == ["5m0s", "10m0s", "30m0s"]
    five, ten, thirty = nm["aggregatedNodeUsages"]
    assert set(five["usage"]) == {"avg", "p50", "p90", "p95", "p99"}
    assert all(_res(five["usage"][k]) == (4000, 10 * GiB) for k in five["usage"])
    assert _res(ten["usage"]["p99"]) == (4000, 10 * GiB)
    assert thirty["usage"] == {"avg": {}, "p50": {}, "p90": {}, "p95": {}, "p99": {}}
    assert [a["duration"] for a in nm["aggregatedSystemUsages"]] == ["5m0s", "10m0s", "30m0s"]
    pods = status["podsMetric"]
    assert [(p["namespace"], p["name"]) for p in pods] == [("batch", "spark-1"), ("default", "web-0")]
    assert pods[1] == {
        "namespace": "default",
        "name": "web-0",
        "podUsage": {"resources": {"cpu": "1500m", "memory": "4Gi"}},
        "priority": "koord-prod",
        "qos": "LS",
    }
    assert status["hostApplicationMetric"] == [
        {
            "name": "nginx",
            "usage": {"resources": {"cpu": "200m", "memory": "100Mi"}},
            "priority": "koord-prod",
            "qos": "LS",
        }
    ]
    # without the prediction hook no prediction fields (docs/reporting.md, "Project decisions"); no NUMA
    # series, no list (docs/prediction.md, "numaUsages")
    assert "prodReclaimableMetric" not in status
    assert "numaUsages" not in nm


def test_cold_start_entries_present_but_empty() -> None:
    h, _ = _history(100)  # 100 s of data: every window (≥ 300 s) is in cold start
    status = build_status(h, CollectPolicy(), PODS, [], WALL)
    assert isinstance(status, dict)
    for key in ("aggregatedNodeUsages", "aggregatedSystemUsages"):
        entries = status["nodeMetric"][key]
        assert len(entries) == 3
        assert all(e["usage"] == {"avg": {}, "p50": {}, "p90": {}, "p95": {}, "p99": {}} for e in entries)
    assert status["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "4"


def test_thirty_minute_window_fills_after_fifteen_minutes() -> None:
    h, _ = _history(901)
    status = build_status(h, CollectPolicy(), PODS, [], WALL)
    assert isinstance(status, dict)
    thirty = status["nodeMetric"]["aggregatedNodeUsages"][2]
    assert _res(thirty["usage"]["p95"]) == (4000, 10 * GiB)


def test_percentiles_follow_the_index_rule() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, clock=clock)
    for i in range(300):  # node CPU 1, 2, …, 300 cores/1000 (millicores 1..300)
        clock.t += 1.0
        h.ingest(snapshot((i + 1) / 1000, GiB))
    status = build_status(
        h,
        parse_collect_policy({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": ["5m"]}}}),
        [],
        [],
        WALL,
    )
    assert isinstance(status, dict)
    usage = status["nodeMetric"]["aggregatedNodeUsages"][0]["usage"]
    # window [now − 300, now] holds all 300 samples; p95 index floor(285) − 1 = 284 → 285 m
    assert usage["p95"]["resources"]["cpu"] == "285m"
    assert usage["p50"]["resources"]["cpu"] == "150m"
    assert usage["p99"]["resources"]["cpu"] == "297m"  # index 297 − 1


def test_no_status_with_an_empty_node_window() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, clock=clock)
    assert isinstance(build_status(h, CollectPolicy(), PODS, [], WALL), StatusSkipped)
    feed(h, clock, 10, snapshot(None, GiB))  # memory but no CPU
    skipped = build_status(h, CollectPolicy(), PODS, [], WALL)
    assert isinstance(skipped, StatusSkipped)
    assert "cpu" in skipped.reason
    clock.t += 400  # data aged out of the 300 s window
    assert isinstance(build_status(h, CollectPolicy(), PODS, [], WALL), StatusSkipped)


def test_system_window_empty_still_reports_node() -> None:
    clock = FakeClock()
    h = ReportHistory(1.0, clock=clock)
    feed(h, clock, 5, snapshot(1.0, GiB))
    h.node["system_cpu"] = type(h.node["system_cpu"])(10)  # pods collector down: no system points
    status = build_status(h, CollectPolicy(), [], [], WALL)
    assert isinstance(status, dict)
    assert status["nodeMetric"]["systemUsage"] == {}
    assert "nodeUsage" in status["nodeMetric"]


def test_page_cache_policy_switches_node_and_pods_at_once() -> None:
    h, _ = _history(400)
    policy = parse_collect_policy({"metricCollectPolicy": {"nodeMemoryCollectPolicy": "usageWithPageCache"}})
    status = build_status(h, policy, PODS, [], WALL)
    assert isinstance(status, dict)
    assert _res(status["nodeMetric"]["nodeUsage"]) == (4000, 12 * GiB)
    web = next(p for p in status["podsMetric"] if p["name"] == "web-0")
    assert _res(web["podUsage"]) == (1500, 5 * GiB)
    # system usage keeps the without-page-cache definition
    assert _res(status["nodeMetric"]["systemUsage"])[1] == 4 * GiB - (100 << 20)
    hot = parse_collect_policy({"metricCollectPolicy": {"nodeMemoryCollectPolicy": "usageWithHotPageCache"}})
    assert not hot.with_page_cache  # docs/reporting.md, "Memory policy fallback"


def test_same_report_ignores_update_time() -> None:
    h, _ = _history(400)
    a = build_status(h, CollectPolicy(), PODS, [], WALL)
    b = build_status(h, CollectPolicy(), PODS, [], WALL + 60)
    assert isinstance(a, dict)
    assert isinstance(b, dict)
    assert a["updateTime"] != b["updateTime"]
    assert same_report(a, b)


def test_policy_merge_and_lower_bounds() -> None:
    p = parse_collect_policy(
        {"metricCollectPolicy": {"aggregateDurationSeconds": 10, "reportIntervalSeconds": 5}}
    )
    assert (p.aggregate_seconds, p.report_interval_seconds) == (60, 30)
    assert p.durations == (300.0, 600.0, 1800.0)
    assert parse_collect_policy(None) == CollectPolicy()
    q = parse_collect_policy({"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": ["1h0m0s"]}}})
    assert q.durations == (3600.0,)
    assert q.node_retention == 3660.0
    bad = parse_collect_policy(
        {"metricCollectPolicy": {"reportIntervalSeconds": "x", "nodeMemoryCollectPolicy": "odd"}}
    )
    assert bad.report_interval_seconds == 60
    assert not bad.with_page_cache
    assert len(bad.problems) == 2
