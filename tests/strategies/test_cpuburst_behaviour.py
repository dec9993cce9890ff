"""CPU burst beyond the numbered cases: capabilities, cgroup v2, dry-run, skips, decisions, limiter."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from koordqos.cgroups.executor import Outcome
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import AgentConfig
from koordqos.model.qos import KubeQoS
from koordqos.strategies import registry
from koordqos.strategies.cpuburst import CPU_BURST_SKIPPED, NAME, CPUBurstStrategy
from koordqos.strategies.cpuburst_plan import NodeBurstState, Operation, quota_writes

from .cpuburst_builders import Harness, build_harness, ctr, make_pod, make_slo


def skipped(reason: str) -> float:
    return CPU_BURST_SKIPPED.labels(reason)._value.get()


def test_registered_and_enabled_by_gate_and_interval() -> None:
    assert "CPUBurst" in registry.registered()
    assert any(isinstance(s, CPUBurstStrategy) for s in registry.build_all())
    s = CPUBurstStrategy()
    assert s.enabled(AgentConfig())  # gate on by default, interval 1 s
    assert s.interval(AgentConfig()) == 1.0
    assert not s.enabled(AgentConfig(feature_gates={"CPUBurst": False}))
    assert not s.enabled(AgentConfig.model_validate({"qos": {"reconcile_interval_seconds": 0}}))


def test_quota_write_order() -> None:
    """Grow the pod before the container, shrink the container before the pod; unlimited pods untouched."""
    up = quota_writes("pod", "pod/c", 500000, 200000, 40000)
    assert [(w.parent, w.value) for w in up] == [("pod", 540000), ("pod/c", 240000)]
    down = quota_writes("pod", "pod/c", 540000, 240000, -40000)
    assert [(w.parent, w.value) for w in down] == [("pod/c", 200000), ("pod", 500000)]
    assert [(w.parent, w.value) for w in quota_writes("pod", "pod/c", -1, 200000, 40000)] == [
        ("pod/c", 240000)
    ]


async def test_missing_burst_file_reported_once_and_static_part_skipped(tmp_path: Path) -> None:
    h = build_harness(tmp_path, burst_file=False)
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=1000)])
    pod_dir = h.add_pod(pod, pod_quota=100000, quotas={"c1": 100000})
    h.metrics(node_cpu=1.0, throttled={"c1": 0.5})
    before = skipped("burst-unsupported")
    with capture_logs() as logs:
        await h.run([pod], make_slo(policy="auto"))
        h.now[0] += 1
        h.metrics(node_cpu=1.0, throttled={"c1": 0.5})
        await h.run([pod], make_slo(policy="auto"))
    warned = [e for e in logs if "static CPU burst skipped" in e["event"]]
    assert len(warned) == 1
    assert warned[0]["resource"] == "cpu.cfs_burst_us"
    assert skipped("burst-unsupported") == before + 1
    assert not h.node.path(pod_dir, "cpu", "cpu.cfs_burst_us").exists()
    assert h.strategy.last is not None
    assert h.strategy.last.static == {}
    # the dynamic part still runs: 100000 → 120000 → 144000
    assert h.quota(f"{pod_dir}/c1") == 144000
    assert h.quota(pod_dir) == 144000


async def test_cgroup_v2_writes_cpu_max_and_burst(tmp_path: Path) -> None:
    h = build_harness(tmp_path, version=CgroupVersion.V2)
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    pod_dir = h.add_pod(pod, pod_quota=200000, quotas={"c1": 200000})
    h.metrics(node_cpu=1.0, throttled={"c1": 0.2})
    await h.run([pod], make_slo(policy="auto", cpuBurstPercent=100))
    assert h.node.read(f"{pod_dir}/c1", "cpu", "cpu.max").split()[0] == "240000"
    assert h.quota(pod_dir) == 240000
    assert h.burst(f"{pod_dir}/c1") == 200000
    assert h.burst(pod_dir) == 200000


async def test_dry_run_changes_nothing_and_records_decisions(tmp_path: Path) -> None:
    h = build_harness(tmp_path, dry_run=True)
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    pod_dir = h.add_pod(pod, pod_quota=200000, quotas={"c1": 200000})
    h.metrics(node_cpu=1.0, throttled={"c1": 0.5})
    await h.run([pod], make_slo(policy="auto"))
    assert h.quota(f"{pod_dir}/c1") == 200000
    assert h.burst(f"{pod_dir}/c1") == 0
    writes = [d for d in h.decisions.recent(strategy=NAME) if d.action == "write"]
    assert {d.target for d in writes} == {
        f"{pod_dir}/c1/cpu.cfs_quota_us",
        f"{pod_dir}/cpu.cfs_quota_us",
        f"{pod_dir}/c1/cpu.cfs_burst_us",
        f"{pod_dir}/cpu.cfs_burst_us",
    }
    assert all(d.dry_run for d in writes)
    quota = next(d for d in writes if d.target == f"{pod_dir}/c1/cpu.cfs_quota_us")
    assert quota.new == "240000"
    assert quota.reason.startswith("scaleUp: node idle")


async def test_no_nodeslo_strategy_does_nothing(harness: Harness) -> None:
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    pod_dir = harness.add_pod(pod, pod_quota=200000, quotas={"c1": 200000})
    harness.metrics(node_cpu=1.0, throttled={"c1": 0.5})
    await harness.run([pod], None)
    assert harness.quota(f"{pod_dir}/c1") == 200000
    assert harness.decisions.recent(strategy=NAME) == []
    slo = make_slo(policy="auto").model_copy(update={"cpu_burst_strategy": None})
    await harness.run([pod], slo)
    assert harness.quota(f"{pod_dir}/c1") == 200000


@pytest.mark.parametrize("qos", ["LSR", "LSE", "BE"])
async def test_non_burstable_qos_untouched(harness: Harness, qos: str) -> None:
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)], qos=qos, kube_qos=KubeQoS.GUARANTEED)
    pod_dir = harness.add_pod(pod, pod_quota=200000, quotas={"c1": 200000})
    harness.metrics(node_cpu=1.0, throttled={"c1": 0.5})
    await harness.run([pod], make_slo(policy="auto"))
    assert harness.quota(f"{pod_dir}/c1") == 200000
    assert harness.burst(f"{pod_dir}/c1") == 0


@pytest.mark.parametrize("qos", ["SYSTEM", None])
async def test_system_and_unlabeled_pods_are_burstable(harness: Harness, qos: str | None) -> None:
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)], qos=qos)
    pod_dir = harness.add_pod(pod, pod_quota=200000, quotas={"c1": 200000})
    harness.metrics(node_cpu=1.0, throttled={"c1": 0.5})
    await harness.run([pod], make_slo(policy="auto"))
    assert harness.quota(f"{pod_dir}/c1") == 240000


async def test_inactive_pods_and_non_running_containers_skipped(harness: Harness) -> None:
    done = make_pod("done", [ctr("main", "d1", cpu_limit=2000)], phase="Succeeded")
    waiting = make_pod("wait", [ctr("main", "w1", cpu_limit=2000, state="waiting")], phase="Pending")
    done_dir = harness.add_pod(done, pod_quota=200000, quotas={"d1": 200000})
    wait_dir = harness.add_pod(waiting, pod_quota=200000, quotas={"w1": 200000})
    harness.metrics(node_cpu=1.0, throttled={"d1": 0.5, "w1": 0.5})
    await harness.run([done, waiting], make_slo(policy="auto"))
    assert harness.quota(f"{done_dir}/d1") == 200000
    assert harness.burst(f"{done_dir}/d1") == 0
    # a pending pod is active: static burst yes, quota burst only for running containers
    assert harness.quota(f"{wait_dir}/w1") == 200000
    assert harness.burst(f"{wait_dir}/w1") == 2_000_000


async def test_hostile_uid_refused_and_round_continues(harness: Harness) -> None:
    bad = make_pod("../../etc", [ctr("main", "x1", cpu_limit=2000)])
    good = make_pod("good", [ctr("main", "g1", cpu_limit=2000)])
    good_dir = harness.add_pod(good, pod_quota=200000, quotas={"g1": 200000})
    harness.metrics(node_cpu=1.0, throttled={"g1": 0.5, "x1": 0.5})
    before = skipped("pod-dir")
    with capture_logs() as logs:
        await harness.run([bad, good], make_slo(policy="auto"))
        await harness.run([bad, good], make_slo(policy="auto"))
    assert skipped("pod-dir") == before + 2
    assert len([e for e in logs if e["event"] == "pod cgroup dir refused"]) == 1
    assert harness.quota(f"{good_dir}/g1") == 288000  # two rounds: ×1.2 twice


async def test_unreadable_quota_skips_container(harness: Harness) -> None:
    """A container whose cgroup is gone is skipped; its sibling still bursts."""
    pod = make_pod("p", [ctr("a", "c1", cpu_limit=2000), ctr("b", "c2", cpu_limit=2000)])
    pod_dir = harness.add_pod(pod, pod_quota=400000, quotas={"c1": 200000, "c2": 200000})
    harness.node.remove_cgroup(f"{pod_dir}/c1")
    harness.metrics(node_cpu=1.0, throttled={"c1": 0.5, "c2": 0.5})
    before = skipped("quota-unreadable")
    await harness.run([pod], make_slo(policy="auto"))
    assert skipped("quota-unreadable") == before + 1
    assert harness.quota(f"{pod_dir}/c2") == 240000
    assert harness.quota(pod_dir) == 440000


async def test_node_state_decision_recorded_on_change_only(harness: Harness) -> None:
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    harness.add_pod(pod, pod_quota=200000, quotas={"c1": 200000})
    for usage in (1.0, 1.0, 9.0):
        harness.now[0] += 6  # past the 5 s averaging window: each round sees only its own sample
        harness.metrics(node_cpu=usage)
        await harness.run([pod], make_slo(policy="auto"))
    states = [d for d in harness.decisions.recent(strategy=NAME) if d.action == "node-state"]
    assert [(d.old, d.new) for d in states] == [(None, "idle"), ("idle", "overload")]
    assert "threshold 50%" in states[-1].reason


async def test_unknown_node_state_holds_quota(harness: Harness) -> None:
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    pod_dir = harness.add_pod(pod, pod_quota=300000, quotas={"c1": 300000})
    harness.metrics(throttled={"c1": 0.5})  # no node sample
    await harness.run([pod], make_slo(policy="auto"))
    report = harness.strategy.last
    assert report is not None
    assert report.node_state is NodeBurstState.UNKNOWN
    assert [d.op for d in report.decisions] == [Operation.REMAIN]
    assert harness.quota(f"{pod_dir}/c1") == 300000


async def test_limiter_over_time_stops_scale_up(harness: Harness) -> None:
    """Period 10 s at 150 %: capacity 500 tokens (starting empty: rand 0); a container running at 150 % of its
    limit never gets tokens, so the limiter scales it down; once idle it saves tokens and may burst again."""
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    pod_dir = harness.add_pod(pod, pod_quota=-1, quotas={"c1": 280000})
    slo = make_slo(policy="auto", cfsQuotaBurstPercent=150, cfsQuotaBurstPeriodSeconds=10)
    ops = []
    for usage in (3.0, 3.0, 0.2, 0.2):  # 150 %, 150 %, 10 %, 10 %
        harness.now[0] += 1
        harness.metrics(node_cpu=1.0, container_cpu={"c1": usage}, throttled={"c1": 0.5})
        await harness.run([pod], slo)
        assert harness.strategy.last is not None
        ops.append(harness.strategy.last.decisions[0].op)
    assert ops == [Operation.SCALE_DOWN, Operation.SCALE_DOWN, Operation.SCALE_UP, Operation.SCALE_UP]
    # 280000 → 224000 → 200000 (floor at base) → 240000 → 288000 (ceil 300000)
    assert harness.quota(f"{pod_dir}/c1") == 288000
    assert list(harness.strategy.limiters.limiters) == ["containerd://c1"]
    harness.now[0] += 21  # > 2 × period without an update
    await harness.run([], slo)
    assert harness.strategy.limiters.limiters == {}


async def test_cached_writes_are_not_repeated(harness: Harness) -> None:
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    harness.add_pod(pod, pod_quota=200000, quotas={"c1": 200000})
    harness.metrics(node_cpu=1.0)
    await harness.run([pod], make_slo(policy="auto"))
    first = [r.outcome for r in harness.strategy.last.results] if harness.strategy.last else []
    assert first == [Outcome.WRITTEN, Outcome.WRITTEN]  # burst: container, pod
    await harness.run([pod], make_slo(policy="auto"))
    again = [r.outcome for r in harness.strategy.last.results] if harness.strategy.last else []
    assert again == [Outcome.CACHED, Outcome.CACHED]
