"""SysctlWrite through the HostActuator on a synthetic proc root (never this machine's /proc/sys)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from koordqos.decisions import DecisionLog
from koordqos.host import HostActuator, Outcome, SysctlWrite
from koordqos.host.outcome import HOST_WRITES


def proc_with(tmp_path: Path, **sysctls: str) -> Path:
    proc = tmp_path / "proc"
    kernel = proc / "sys/kernel"
    kernel.mkdir(parents=True)
    for name, value in sysctls.items():
        (kernel / name).write_text(value + "\n")
    return proc


def read(proc: Path, name: str) -> str:
    return (proc / "sys" / name).read_text().strip()


async def test_write_if_different_and_recorded(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, sched_core="1", sched_group_identity_enabled="1")
    decisions = DecisionLog()
    host = HostActuator(decisions, proc_root=proc)
    results = await host.apply(
        "t",
        [SysctlWrite("kernel/sched_core", "0"), SysctlWrite("kernel/sched_group_identity_enabled", "1")],
        reason="GroupIdentity",
    )
    assert [r.outcome for r in results] == [Outcome.WRITTEN, Outcome.UNCHANGED]
    assert (results[0].old, results[0].new) == ("1", "0")
    assert read(proc, "kernel/sched_core") == "0"
    [d] = decisions.recent()
    assert (d.strategy, d.target, d.action, d.old, d.new, d.reason, d.dry_run) == (
        "t",
        "sysctl/kernel/sched_core",
        "write",
        "1",
        "0",
        "GroupIdentity",
        False,
    )


async def test_multi_value_sysctl_compares_by_fields(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, printk="4\t4\t1\t7")
    host = HostActuator(DecisionLog(), proc_root=proc)
    [r] = await host.apply("t", [SysctlWrite("kernel/printk", "4 4 1 7")])
    assert r.outcome is Outcome.UNCHANGED


async def test_dry_run_records_and_writes_nothing(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, sched_core="1")
    decisions = DecisionLog(dry_run=True)
    host = HostActuator(decisions, proc_root=proc)
    [r] = await host.apply("t", [SysctlWrite("kernel/sched_core", "0", reason="why")])
    assert r.outcome is Outcome.DRY_RUN
    assert read(proc, "kernel/sched_core") == "1"
    [d] = decisions.recent()
    assert d.dry_run
    assert d.new == "0"
    assert d.reason == "why"


async def test_dry_run_flag_overrides_the_decision_log(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, sched_core="1")
    host = HostActuator(DecisionLog(dry_run=False), proc_root=proc, dry_run=True)
    [r] = await host.apply("t", [SysctlWrite("kernel/sched_core", "0")])
    assert r.outcome is Outcome.DRY_RUN
    assert read(proc, "kernel/sched_core") == "1"


async def test_missing_sysctl_is_unsupported_not_an_error(tmp_path: Path) -> None:
    proc = proc_with(tmp_path)
    decisions = DecisionLog()
    host = HostActuator(decisions, proc_root=proc)
    [r] = await host.apply("t", [SysctlWrite("kernel/sched_core", "0")])
    assert r.outcome is Outcome.UNSUPPORTED
    assert r.ok
    assert len(decisions) == 0
    assert not (proc / "sys/kernel/sched_core").exists()


async def test_component_swapped_for_a_symlink_between_two_writes_is_refused(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, sched_core="1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sched_core").write_text("1\n")
    decisions = DecisionLog()
    host = HostActuator(decisions, proc_root=proc)
    [first] = await host.apply("t", [SysctlWrite("kernel/sched_core", "0")])
    assert first.outcome is Outcome.WRITTEN
    # the same path, now through a symlink to a directory outside the root
    shutil.rmtree(proc / "sys/kernel")
    os.symlink(outside, proc / "sys/kernel")
    refused = HOST_WRITES.labels("sysctl", "refused")
    before = refused._value.get()
    [second] = await host.apply("t", [SysctlWrite("kernel/sched_core", "0")])
    assert second.outcome is Outcome.REFUSED
    assert not second.ok
    assert "symlink 'kernel'" in second.error
    assert (outside / "sched_core").read_text() == "1\n"
    assert refused._value.get() == before + 1
    assert decisions.recent()[-1].action == "write-refused"


async def test_symlinked_leaf_is_refused(tmp_path: Path) -> None:
    proc = proc_with(tmp_path)
    target = tmp_path / "elsewhere"
    target.write_text("1\n")
    os.symlink(target, proc / "sys/kernel/sched_core")
    host = HostActuator(DecisionLog(), proc_root=proc)
    [r] = await host.apply("t", [SysctlWrite("kernel/sched_core", "0")])
    assert r.outcome is Outcome.REFUSED
    assert target.read_text() == "1\n"


async def test_names_leaving_the_root_and_bad_values_are_refused(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, sched_core="1")
    (tmp_path / "x").write_text("1\n")
    host = HostActuator(DecisionLog(), proc_root=proc)
    results = await host.apply(
        "t",
        [
            SysctlWrite("../../x", "0"),
            SysctlWrite("/etc/passwd", "0"),
            SysctlWrite("kernel/sched_core", "0\n1"),
            SysctlWrite("kernel/sched_core", ""),
        ],
    )
    assert [r.outcome for r in results] == [
        Outcome.REFUSED,
        Outcome.REFUSED,
        Outcome.INVALID,
        Outcome.INVALID,
    ]
    assert (tmp_path / "x").read_text() == "1\n"
    assert read(proc, "kernel/sched_core") == "1"


async def test_unreadable_sysctl_fails_and_is_logged_once(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    proc = proc_with(tmp_path)
    (proc / "sys/kernel/sched_core").mkdir()  # exists but cannot be read as a file
    host = HostActuator(DecisionLog(), proc_root=proc)
    with capture_logs() as logs:
        for _ in range(3):
            [r] = await host.apply("t", [SysctlWrite("kernel/sched_core", "0")])
            assert r.outcome is Outcome.FAILED
    assert len([e for e in logs if e["event"] == "host write not applied"]) == 1
