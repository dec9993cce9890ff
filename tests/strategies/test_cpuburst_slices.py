"""CPU burst's work over every pod runs in slices: the candidates (rebuilt when the pods change) and the share
pool's usage (looked up every round) stop every PODS_PER_STEP pods, so a round at 1,000 pods gives the event
loop turns in between (issue #18: no loop step over 5 ms). Structure, not timing: budgets are benchmarks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from immutables import Map

from koordqos.model.pod import PodInfo
from koordqos.state import NodeState
from koordqos.strategies import cpuburst
from koordqos.strategies.cpuburst import PODS_PER_STEP
from koordqos.strategies.cpuburst_plan import NodeBurstState

from .cpuburst_builders import build_harness, ctr, make_pod, make_slo

PODS = 1000


def _pods(n: int) -> list[PodInfo]:
    """n pods, alternately BE (in the share pool) and LS (a burst candidate), one container each."""
    return [
        make_pod(f"p{i}", [ctr("main", f"c{i}", cpu_limit=1000)], qos="BE" if i % 2 else "LS")
        for i in range(n)
    ]


def _state(pods: list[PodInfo]) -> NodeState:
    return NodeState(pods=Map({p.uid: p for p in pods}), node_slo=make_slo(policy="none"))


def test_the_share_pool_usage_of_1000_pods_is_looked_up_in_slices(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    pods = _pods(PODS)
    h.metrics(node_cpu=6.0, pod_cpu={p.uid: 0.01 for p in pods})
    state = _state(pods)
    steps = list(h.strategy.node_state_steps(state, h.env))
    # a pause after every PODS_PER_STEP of the 500 BE pods, then the result (the same as in one go)
    assert steps[:-1] == [None] * ((PODS // 2) // PODS_PER_STEP)
    assert steps[-1] == h.strategy.node_state(state, h.env)
    got, pool = steps[-1]  # type: ignore[misc]
    assert got is NodeBurstState.IDLE
    assert pool is not None
    assert pool.usage == pytest.approx(6.0 - 500 * 0.01)


def test_the_candidates_are_rebuilt_in_slices_and_kept_while_the_pods_stay(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    state = _state(_pods(PODS))
    cfg = state.node_slo.cpu_burst_strategy  # type: ignore[union-attr]
    assert cfg is not None
    assert len(list(h.strategy.candidate_steps(state, cfg))) == PODS // PODS_PER_STEP
    assert {p.uid for p, _ in h.strategy.candidates(state, cfg)} == {f"p{i}" for i in range(0, PODS, 2)}
    assert list(h.strategy.candidate_steps(state, cfg)) == []  # the same pods mapping: nothing to do


async def test_a_round_over_1000_pods_gives_the_loop_turns_before_visiting_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build_harness(tmp_path)
    pods = [p for p in _pods(PODS) if p.qos_raw.value == "BE"]  # no candidate: no pod is visited
    h.metrics(node_cpu=6.0, pod_cpu={p.uid: 0.01 for p in pods})
    monkeypatch.setattr(cpuburst, "YIELD_AFTER_SECONDS", 0.0)  # every pause becomes a turn for the loop
    turns = 0
    stop = asyncio.Event()

    async def other() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    start = turns
    await h.strategy.run_once(_state(pods), h.env)
    stop.set()
    await task
    assert h.strategy.visited == 0
    # the candidates' rebuild over 500 pods and the 500 pool pods' usage: both paused every PODS_PER_STEP
    assert turns - start >= 2 * (len(pods) // PODS_PER_STEP)
