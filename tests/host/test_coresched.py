"""Core-sched cookies: the caches (koordlet's cases K15–K17, pruning) and the intents through the
HostActuator."""

from __future__ import annotations

from pathlib import Path

from koordqos.decisions import DecisionLog
from koordqos.hooks.coresched import pod_enabled_and_group
from koordqos.host import CoreSchedCookie, CoreSchedPrune, HostActuator, Outcome
from koordqos.host.coresched import CookieEntry, CookieManager
from koordqos.model.qos import KubeQoS
from koordqos.testing.cookies import FakeCookieKernel
from tests.hooks.test_coresched import ENABLED_RULE, GID, POLICY, QOS


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


# -- the cookie caches (docs/behaviour-runtime-hooks.md, "CoreSched"; koordlet's cases K15–K17) --------------


def test_k15_add_cookie() -> None:
    kernel = FakeCookieKernel({}, {12346})
    mgr = CookieManager(kernel)
    _, group = pod_enabled_and_group(ENABLED_RULE, {QOS: "LS", GID: "group-xxx"}, "uid", KubeQoS.BURSTABLE)
    assert group == "group-xxx-expeller"
    mgr.enable("uid", "containerd://c1", group, [12344, 12345, 12346])
    assert mgr.cookies[group].cookie == 1000000
    assert mgr.cookies[group].pids == {12344, 12345}
    assert kernel.cookies[12345] == 1000000


def test_k16_assign_cookie_from_a_sibling() -> None:
    kernel = FakeCookieKernel({1000: 1000000, 1001: 1000000, 1002: 1000000}, {12346}, next_cookie=2000000)
    mgr = CookieManager(kernel)
    mgr.cookies["group-xxx-expeller"] = CookieEntry(1000000, {1000, 1001, 1002})
    mgr.enable("uid", "containerd://c1", "group-xxx-expeller", [12344, 12345, 12346])
    assert mgr.cookies["group-xxx-expeller"].pids == {1000, 1001, 1002, 12344, 12345}
    assert kernel.cookies[12344] == 1000000
    assert kernel.next_cookie == 2000000


def test_k17_clear_cookie() -> None:
    kernel = FakeCookieKernel({p: 1000000 for p in (1000, 1001, 1002, 12344)}, set())
    mgr = CookieManager(kernel)
    mgr.cookies["g"] = CookieEntry(1000000, {1000, 1001, 1002, 12344})
    mgr.groups["uid/containerd://c1"] = "g"
    enabled, _ = pod_enabled_and_group(ENABLED_RULE, {QOS: "LS", POLICY: "none"}, "uid", KubeQoS.BURSTABLE)
    assert enabled is False
    mgr.disable("uid", "containerd://c1", [12344])
    assert mgr.cookies["g"].pids == {1000, 1001, 1002}
    assert kernel.cookies[12344] == 0


def _procs(root: Path, *pids: int) -> Path:
    for pid in pids:
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
    return root


def test_prune_drops_dead_pids_so_a_reused_pid_gets_the_cookie(tmp_path: Path) -> None:
    import shutil

    proc_root = _procs(tmp_path / "proc", 100, 101)
    kernel = FakeCookieKernel({}, set())
    mgr = CookieManager(kernel)
    mgr.enable("uid", "containerd://c1", "g", [100, 101])
    cookie = mgr.cookies["g"].cookie
    assert mgr.cookies["g"].pids == {100, 101}
    # 101 exits; the kernel forgets its cookie; a new process of container c2 then reuses PID 101
    shutil.rmtree(proc_root / "101")
    del kernel.cookies[101]
    mgr.prune({"uid/containerd://c1", "uid/containerd://c2"}, proc_root)
    assert mgr.cookies["g"].pids == {100}
    _procs(proc_root, 101)
    mgr.enable("uid", "containerd://c2", "g", [101])
    assert kernel.cookies[101] == cookie
    assert mgr.groups == {"uid/containerd://c1": "g", "uid/containerd://c2": "g"}


def test_prune_forgets_containers_gone_and_emptied_cookies(tmp_path: Path) -> None:
    proc_root = _procs(tmp_path / "proc", 100, 200)
    mgr = CookieManager(FakeCookieKernel({}, set()))
    mgr.enable("u1", "containerd://c1", "g1", [100])
    mgr.enable("u2", "containerd://c2", "g2", [200, 201])  # 201 has no /proc entry: dead
    mgr.prune({"u2/containerd://c2"}, proc_root)
    assert mgr.groups == {"u2/containerd://c2": "g2"}
    assert mgr.cookies["g2"].pids == {200}
    assert "g1" in mgr.cookies  # PID 100 still lives (e.g. moved elsewhere): the cookie stays shareable
    (proc_root / "100").rmdir()
    mgr.prune(set(), proc_root)
    assert mgr.groups == {}
    assert set(mgr.cookies) == {"g2"}
    (proc_root / "200").rmdir()
    mgr.prune(set(), proc_root)
    assert mgr.cookies == {}
