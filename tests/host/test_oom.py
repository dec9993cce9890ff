"""OomScoreAdjWrite through the HostActuator on a synthetic /proc."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from koordqos.decisions import DecisionLog
from koordqos.host import HostActuator, OomScoreAdjWrite, Outcome


def proc(tmp_path: Path, values: dict[int, int | None]) -> Path:
    root = tmp_path / "proc"
    for pid, v in values.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        if v is not None:
            (d / "oom_score_adj").write_text(f"{v}\n")
    root.mkdir(exist_ok=True)
    return root


def read(root: Path, pid: int) -> int:
    return int((root / str(pid) / "oom_score_adj").read_text())


async def test_only_differing_pids_are_written_and_recorded(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: 0, 13: -500})
    decisions = DecisionLog()
    host = HostActuator(decisions, proc_root=root)
    results = await host.apply("t", [OomScoreAdjWrite(12, -500), OomScoreAdjWrite(13, -500)], "OOMScoreAdj")
    assert [r.outcome for r in results] == [Outcome.WRITTEN, Outcome.UNCHANGED]
    assert (read(root, 12), read(root, 13)) == (-500, -500)
    [d] = decisions.recent()
    assert (d.target, d.old, d.new, d.reason) == ("pid/12/oom_score_adj", 0, -500, "OOMScoreAdj")


async def test_vanished_pid_is_an_outcome_not_an_error(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: None, 13: 0})  # 12 has no oom file, 99 has no /proc entry at all
    decisions = DecisionLog()
    host = HostActuator(decisions, proc_root=root)
    results = await host.apply(
        "t", [OomScoreAdjWrite(99, 5), OomScoreAdjWrite(12, 5), OomScoreAdjWrite(13, 5)]
    )
    assert [r.outcome for r in results] == [Outcome.VANISHED, Outcome.VANISHED, Outcome.WRITTEN]
    assert all(r.ok for r in results)
    assert read(root, 13) == 5
    assert [d.target for d in decisions.recent()] == ["pid/13/oom_score_adj"]


async def test_dry_run_records_and_changes_nothing(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: 0})
    decisions = DecisionLog(dry_run=True)
    host = HostActuator(decisions, proc_root=root)
    [r] = await host.apply("t", [OomScoreAdjWrite(12, -500)])
    assert r.outcome is Outcome.DRY_RUN
    assert read(root, 12) == 0
    assert decisions.recent()[-1].new == -500
    assert decisions.recent()[-1].dry_run


async def test_out_of_range_values_are_invalid(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: 0})
    host = HostActuator(DecisionLog(), proc_root=root)
    results = await host.apply(
        "t", [OomScoreAdjWrite(12, 1001), OomScoreAdjWrite(12, -1001), OomScoreAdjWrite(0, 1)]
    )
    assert [r.outcome for r in results] == [Outcome.INVALID] * 3
    assert read(root, 12) == 0


async def test_pid_dir_swapped_for_a_symlink_is_refused_at_write_time(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: 0})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "oom_score_adj").write_text("0\n")
    host = HostActuator(DecisionLog(), proc_root=root)
    [ok] = await host.apply("t", [OomScoreAdjWrite(12, 7)])
    assert ok.outcome is Outcome.WRITTEN
    shutil.rmtree(root / "12")
    os.symlink(outside, root / "12")
    [refused] = await host.apply("t", [OomScoreAdjWrite(12, 9)])
    assert refused.outcome is Outcome.REFUSED
    assert (outside / "oom_score_adj").read_text() == "0\n"


async def test_unparsable_value_fails(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: 0})
    (root / "12/oom_score_adj").write_text("garbage\n")
    host = HostActuator(DecisionLog(), proc_root=root)
    [r] = await host.apply("t", [OomScoreAdjWrite(12, 1)])
    assert r.outcome is Outcome.FAILED
    assert "garbage" in r.error
