"""CoreSchedCookie / CoreSchedPrune through the HostActuator, with an in-memory cookie kernel."""

from __future__ import annotations

from pathlib import Path

from koordqos.decisions import DecisionLog
from koordqos.host import CoreSchedCookie, CoreSchedPrune, HostActuator, Outcome
from koordqos.testing.cookies import FakeCookieKernel


def proc(tmp_path: Path, *pids: int) -> Path:
    root = tmp_path / "proc"
    root.mkdir(exist_ok=True)
    for pid in pids:
        (root / str(pid)).mkdir()
    return root


async def test_enable_then_unchanged_then_disable(tmp_path: Path) -> None:
    kernel = FakeCookieKernel()
    decisions = DecisionLog()
    host = HostActuator(decisions, proc_root=proc(tmp_path, 100, 101), cookie_ops=kernel)
    on = CoreSchedCookie("uid", "containerd://c1", (100, 101), True, "g")
    [r] = await host.apply("t", [on], "CoreSched")
    assert r.outcome is Outcome.WRITTEN
    assert kernel.cookies[100] == kernel.cookies[101] != 0
    [again] = await host.apply("t", [on])
    assert again.outcome is Outcome.UNCHANGED
    [off] = await host.apply("t", [CoreSchedCookie("uid", "containerd://c1", (100, 101), False)])
    assert off.outcome is Outcome.WRITTEN
    assert kernel.cookies[100] == kernel.cookies[101] == 0
    assert [(d.target, d.action) for d in decisions.recent()] == [
        ("core-sched/uid/containerd://c1", "core-sched-enable"),
        ("core-sched/uid/containerd://c1", "core-sched-disable"),
    ]


async def test_dry_run_records_and_leaves_the_kernel_alone(tmp_path: Path) -> None:
    kernel = FakeCookieKernel()
    decisions = DecisionLog(dry_run=True)
    host = HostActuator(decisions, proc_root=proc(tmp_path, 100), cookie_ops=kernel)
    [r] = await host.apply("t", [CoreSchedCookie("uid", "c", (100,), True, "g")])
    assert r.outcome is Outcome.DRY_RUN
    assert kernel.cookies == {}
    assert decisions.recent()[-1].dry_run


async def test_no_process_and_no_kernel_support_are_outcomes(tmp_path: Path) -> None:
    with_ops = HostActuator(DecisionLog(), proc_root=proc(tmp_path), cookie_ops=FakeCookieKernel())
    [gone] = await with_ops.apply("t", [CoreSchedCookie("uid", "c", (), True, "g")])
    assert gone.outcome is Outcome.VANISHED
    without = HostActuator(DecisionLog(), proc_root=tmp_path / "proc")
    assert without.cookies is None
    [r] = await without.apply("t", [CoreSchedCookie("uid", "c", (1,), True, "g")])
    assert r.outcome is Outcome.UNSUPPORTED


async def test_create_refused_by_the_kernel_fails(tmp_path: Path) -> None:
    host = HostActuator(DecisionLog(), proc_root=proc(tmp_path, 7), cookie_ops=FakeCookieKernel(broken={7}))
    [r] = await host.apply("t", [CoreSchedCookie("uid", "c", (7,), True, "g")])
    assert r.outcome is Outcome.FAILED
    assert "create a cookie on pid 7" in r.error


async def test_prune_forgets_gone_containers_and_dead_pids(tmp_path: Path) -> None:
    root = proc(tmp_path, 100)
    kernel = FakeCookieKernel()
    host = HostActuator(DecisionLog(), proc_root=root, cookie_ops=kernel)
    await host.apply("t", [CoreSchedCookie("uid", "c", (100,), True, "g")])
    cookies = host.cookies
    assert cookies is not None
    assert set(cookies.groups) == {"uid/c"}
    (root / "100").rmdir()
    [r] = await host.apply("t", [CoreSchedPrune(frozenset())])
    assert r.outcome is Outcome.UNCHANGED
    assert cookies.groups == {}
    assert cookies.cookies == {}
