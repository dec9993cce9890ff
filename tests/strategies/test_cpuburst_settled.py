"""CPU burst work follows the pods with a burst policy: pods under `none` (or `cpuBurstOnly`) are settled
after one clean visit and not visited again until they, the config, or the full pass come round."""

from __future__ import annotations

from pathlib import Path

from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState
from koordqos.strategies.cpuburst import FULL_PASS_SECONDS

from .cpuburst_builders import Harness, build_harness, ctr, make_pod, make_slo


def _pods(h: Harness, n: int, burst_every: int = 0) -> list[PodInfo]:
    """n LS pods with one 1-core container at its base quota; every k-th with its own `auto` policy."""
    pods = []
    for i in range(n):
        burst = {"policy": "auto"} if burst_every and i % burst_every == 0 else None
        pod = make_pod(f"p{i}", [ctr("main", f"c{i}", cpu_limit=1000)], burst=burst)
        h.add_pod(pod, pod_quota=100000, quotas={f"c{i}": 100000})
        pods.append(pod)
    return pods


async def _round(h: Harness, state: NodeState) -> int:
    """One round 1 s later on the same state; the files it read."""
    h.now[0] += 1
    h.metrics(node_cpu=1.0)
    reads = h.executor.file_reads
    await h.strategy.run_once(state, h.env)
    return h.executor.file_reads - reads


async def test_policy_none_pods_are_not_visited_once_settled(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    pods = _pods(h, 5)
    state = NodeState(pods={p.uid: p for p in pods}, node_slo=make_slo(policy="none"))
    assert await _round(h, state) > 0  # the first round resets every pod (burst 0, base quota)
    assert h.strategy.visited == 5
    for _ in range(3):
        assert await _round(h, state) == 0
        assert h.strategy.visited == 0
        assert h.strategy.last is not None
        assert h.strategy.last.decisions == []


async def test_mixed_node_visits_only_the_pods_with_a_burst_policy(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    pods = _pods(h, 10, burst_every=5)  # p0 and p5 annotated auto over a `none` node
    state = NodeState(pods={p.uid: p for p in pods}, node_slo=make_slo(policy="none"))
    await _round(h, state)
    await _round(h, state)
    assert h.strategy.visited == 2
    assert h.strategy.last is not None
    assert sorted(d.pod for d in h.strategy.last.decisions) == ["default/p0", "default/p5"]


async def test_quota_changed_behind_our_back_is_reset_by_the_full_pass(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    pods = _pods(h, 2)
    state = NodeState(pods={p.uid: p for p in pods}, node_slo=make_slo(policy="none"))
    await _round(h, state)
    cdir = f"{h.env.pod_dir(pods[0])}/c0"
    h.write_quota(cdir, 150000)  # someone scaled it
    await _round(h, state)
    assert h.quota(cdir) == 150000  # settled: not looked at within the full-pass period
    h.now[0] += FULL_PASS_SECONDS
    await _round(h, state)
    assert h.quota(cdir) == 100000  # reset to the base by the full pass
    assert h.strategy.visited == 2


async def test_a_changed_pod_or_config_is_visited_at_once(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    pods = _pods(h, 3)
    slo: NodeSLO = make_slo(policy="none")
    await _round(h, NodeState(pods={p.uid: p for p in pods}, node_slo=slo))
    # the pod object changes (e.g. an annotation): only it is visited
    changed = make_pod("p1", [ctr("main", "c1", cpu_limit=1000)], burst={"policy": "cpuBurstOnly"})
    pods[1] = changed
    await _round(h, NodeState(pods={p.uid: p for p in pods}, node_slo=slo))
    assert h.strategy.visited == 1
    assert h.burst(f"{h.env.pod_dir(changed)}/c1") == 1_000_000  # 1 core x 1000 % x 100 ms period
    # an equal NodeSLO re-sent: nothing to visit; a different one: every pod whose effective config moved
    # (p1's own cpuBurstOnly still wins over the node's new policy: it stays settled)
    await _round(h, NodeState(pods={p.uid: p for p in pods}, node_slo=make_slo(policy="none")))
    assert h.strategy.visited == 0
    await _round(h, NodeState(pods={p.uid: p for p in pods}, node_slo=make_slo(policy="auto")))
    assert h.strategy.visited == 2
    assert h.strategy.last is not None
    assert sorted({d.pod for d in h.strategy.last.decisions}) == ["default/p0", "default/p2"]


async def test_a_failed_reset_is_retried_next_round(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    pods = _pods(h, 1)
    state = NodeState(pods={p.uid: p for p in pods}, node_slo=make_slo(policy="none"))
    cdir = f"{h.env.pod_dir(pods[0])}/c0"
    quota_file = h.node.cgroup_root / "cpu" / cdir / "cpu.cfs_quota_us"
    quota_file.unlink()  # unreadable quota: the visit is not clean
    await _round(h, state)
    assert h.strategy.visited == 1
    h.write_quota(cdir, 150000)
    await _round(h, state)
    assert h.strategy.visited == 1
    assert h.quota(cdir) == 100000
