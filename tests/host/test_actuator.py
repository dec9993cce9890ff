"""HostActuator batching: off the loop, one worker hop per batch, results in order, bad roots."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from koordqos.decisions import DecisionLog
from koordqos.host import HostActuator, OomScoreAdjWrite, Outcome, SysctlWrite
from koordqos.host.outcome import Batch, HostResult


def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    (root / "sys/kernel").mkdir(parents=True)
    (root / "sys/kernel/sched_core").write_text("1\n")
    for pid in (10, 11):
        (root / str(pid)).mkdir()
        (root / str(pid) / "oom_score_adj").write_text("0\n")
    return root


async def test_a_batch_runs_in_one_worker_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from koordqos.host import actuator as mod
    from koordqos.host.oom import apply_oom_score_adj

    threads: list[int] = []
    real = apply_oom_score_adj

    def spy(batch: Batch, w: OomScoreAdjWrite) -> HostResult:
        threads.append(threading.get_ident())
        return real(batch, w)

    monkeypatch.setitem(mod.HANDLERS, OomScoreAdjWrite, spy)
    host = HostActuator(DecisionLog(), proc_root=proc(tmp_path))
    results = await host.apply(
        "t", [SysctlWrite("kernel/sched_core", "0"), OomScoreAdjWrite(10, 3), OomScoreAdjWrite(11, 4)]
    )
    assert [r.outcome for r in results] == [Outcome.WRITTEN] * 3
    assert [type(r.intent) for r in results] == [SysctlWrite, OomScoreAdjWrite, OomScoreAdjWrite]
    assert len(set(threads)) == 1
    assert threads[0] != threading.get_ident()
    assert host.batches == 1


async def test_an_empty_batch_costs_no_thread_hop(tmp_path: Path) -> None:
    host = HostActuator(DecisionLog(), proc_root=proc(tmp_path))
    assert await host.apply("t", []) == []
    assert host.batches == 0


async def test_a_missing_root_fails_each_intent_without_raising(tmp_path: Path) -> None:
    host = HostActuator(DecisionLog(), proc_root=tmp_path / "nope")
    results = await host.apply("t", [SysctlWrite("kernel/sched_core", "0"), OomScoreAdjWrite(10, 1)])
    assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.FAILED]
    assert "root" in results[0].error


def test_an_intent_without_a_handler_is_a_programming_error(tmp_path: Path) -> None:
    host = HostActuator(DecisionLog(), proc_root=proc(tmp_path))
    with pytest.raises(TypeError, match="no host handler"):
        host.apply_now("t", ["not an intent"])  # type: ignore[list-item]
