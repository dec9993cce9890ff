"""The hook core: one call's hooks in name order on one context, the deadline, the failure policy, and the
pod cgroup writes before the reply. (These are the rules `EventBus.request` used to carry.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from koordqos.cgroups.executor import CgroupExecutor
from koordqos.decisions import DecisionLog
from koordqos.errors import HookError, TimeoutException
from koordqos.hooks.context import PodContext, PodRequest, Stage
from koordqos.hooks.core import Call, HookCore, call_deadline, run_call, run_stage, start_call
from koordqos.hooks.framework import HookRegistry
from koordqos.hooks.runtime import HookOptions, RuntimeHooks
from koordqos.observability import REGISTRY
from koordqos.state import NodeState
from koordqos.testing.nodefs import SyntheticNode

STAGE = Stage.PRE_RUN_POD_SANDBOX


def ctx() -> PodContext:
    return PodContext(PodRequest(uid="u"))


def trace_hook(trace: list[str], name: str, quota: int | None = None) -> object:
    def fn(c: PodContext) -> None:
        trace.append(name)
        if quota is not None:
            c.response.resources.cfs_quota = quota

    return fn


async def test_a_call_runs_the_stage_in_name_order_on_one_context() -> None:
    reg = HookRegistry()
    trace: list[str] = []
    reg.register(STAGE, "zeta", "", trace_hook(trace, "zeta", 2))  # type: ignore[arg-type]
    reg.register(STAGE, "alpha", "", trace_hook(trace, "alpha", 1))  # type: ignore[arg-type]
    c = ctx()
    call = await run_call("Create", 1.0, "Ignore", lambda call: run_stage(reg, call, STAGE, c))
    assert trace == ["alpha", "zeta"]
    assert call.ran == ["alpha", "zeta"]
    assert c.response.resources.cfs_quota == 2  # last writer wins
    assert not call.timed_out


async def test_a_hanging_step_does_not_hang_the_call_under_ignore() -> None:
    c = ctx()

    async def body(call: Call) -> None:
        c.response.resources.cfs_quota = 7
        await asyncio.Event().wait()

    loop = asyncio.get_running_loop()
    start = loop.time()
    call = await run_call("Create", 0.05, "Ignore", body)
    elapsed = loop.time() - start
    assert call.timed_out
    assert c.response.resources.cfs_quota == 7  # what completed work contributed is kept
    assert elapsed < 1.0  # generous: proves the deadline cut it, not a budget


async def test_a_hanging_step_fails_the_call_under_fail() -> None:
    async def hang(call: Call) -> None:
        await asyncio.Event().wait()

    with pytest.raises(TimeoutException, match="hang"):
        await run_call("hang", 0.05, "Fail", hang)


async def test_a_raising_hook_is_skipped_under_ignore_and_fails_under_fail() -> None:
    reg = HookRegistry()
    trace: list[str] = []

    def boom(c: PodContext) -> None:
        raise ValueError("bad annotation")

    reg.register(STAGE, "a-boom", "", boom)
    reg.register(STAGE, "b-after", "", trace_hook(trace, "after"))  # type: ignore[arg-type]
    call = await run_call("Create", 1.0, "Ignore", lambda call: run_stage(reg, call, STAGE, ctx()))
    assert call.errors == {"a-boom": "ValueError: bad annotation"}
    assert trace == ["after"]
    with pytest.raises(HookError, match="a-boom"):
        await run_call("Create", 1.0, "Fail", lambda call: run_stage(reg, call, STAGE, ctx()))
    assert trace == ["after"]  # under Fail the first error stops the stage


async def test_a_raising_step_outside_the_hooks_follows_the_policy() -> None:
    def broken(call: Call) -> None:
        raise KeyError("conversion")

    call = await run_call("Create", 1.0, "Ignore", broken)
    assert call.errors == {"Create": "KeyError: 'conversion'"}
    with pytest.raises(HookError, match="conversion"):
        await run_call("Create", 1.0, "Fail", broken)


async def test_a_synchronous_hook_past_the_deadline_stops_the_stage() -> None:
    """asyncio.timeout cannot interrupt a hook that never awaits: the overrun is still detected."""
    reg = HookRegistry()
    trace: list[str] = []

    def slow(c: PodContext) -> None:
        time.sleep(0.08)  # the hook under test blocks; this is its behaviour, not a wait
        trace.append("slow")
        c.response.resources.cfs_quota = 3

    reg.register(STAGE, "a-slow", "", slow)
    reg.register(STAGE, "b-after", "", trace_hook(trace, "after"))  # type: ignore[arg-type]
    c = ctx()
    call = await run_call("Create", 0.02, "Ignore", lambda call: run_stage(reg, call, STAGE, c))
    assert call.timed_out
    assert trace == ["slow"]  # the next hook did not run
    assert c.response.resources.cfs_quota == 3  # the completed hook's contribution is kept
    run_stage(reg, call, STAGE, ctx())  # a later stage of the same call runs nothing
    assert trace == ["slow"]
    with pytest.raises(TimeoutException, match="a-slow"):
        await run_call("Create", 0.02, "Fail", lambda call: run_stage(reg, call, STAGE, ctx()))


def test_call_deadline_keeps_a_margin() -> None:
    assert call_deadline(2.0, 0.0) == pytest.approx(1.6)
    assert call_deadline(2.0, 0.0, timeout_nano=1_000_000_000) == pytest.approx(0.8)
    assert call_deadline(10.0, 1.0) == pytest.approx(8.5)
    assert call_deadline(0.2, 0.5) == 0.001


def _seconds_count(call: str) -> float:
    value = REGISTRY.get_sample_value("koordqos_bus_request_seconds_count", {"type": call})
    return value or 0.0


async def test_every_call_is_timed_under_its_name() -> None:
    before = _seconds_count("TimedCall")
    await run_call("TimedCall", 1.0, "Ignore", lambda call: None)
    assert _seconds_count("TimedCall") == before + 1


async def test_pod_stage_writes_the_pod_cgroup_before_returning(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    pod_dir = "kubepods/besteffort/podu"
    node.make_cgroup(pod_dir)
    hooks = RuntimeHooks(HookOptions(gates={}))

    def quota(c: PodContext) -> None:
        c.response.resources.cfs_quota = 50000

    hooks.registry.register(STAGE, "quota", "", quota)
    core = HookCore(hooks, CgroupExecutor(node.layout, DecisionLog()), DecisionLog())
    c = PodContext(PodRequest(uid="u", cgroup_parent=pod_dir))
    call = await run_call(
        "RunPod", 1.0, "Fail", lambda call: core.pod_stage(call, STAGE, c, NodeState(), "test")
    )
    assert call.ran[-1] == "quota"
    assert node.read(pod_dir, "cpu", "cpu.cfs_quota_us") == "50000"


async def test_pod_stage_writes_nothing_when_a_hook_fails_under_fail(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    pod_dir = "kubepods/besteffort/podu"
    node.make_cgroup(pod_dir)
    before = node.read(pod_dir, "cpu", "cpu.cfs_quota_us")
    hooks = RuntimeHooks(HookOptions(gates={}))

    def quota(c: PodContext) -> None:
        c.response.resources.cfs_quota = 50000

    def zz_boom(c: PodContext) -> None:
        raise RuntimeError("boom")

    hooks.registry.register(STAGE, "quota", "", quota)
    hooks.registry.register(STAGE, "zz-boom", "", zz_boom)
    core = HookCore(hooks, CgroupExecutor(node.layout, DecisionLog()), DecisionLog())
    c = PodContext(PodRequest(uid="u", cgroup_parent=pod_dir))
    with pytest.raises(HookError, match="boom"):
        await run_call("RunPod", 1.0, "Fail", lambda call: core.pod_stage(call, STAGE, c, NodeState(), "t"))
    assert node.read(pod_dir, "cpu", "cpu.cfs_quota_us") == before


def _timings(call_name: str, hook: str) -> tuple[float, float]:
    """How many durations were observed for calls named `call_name` and for `hook` at STAGE."""
    calls = REGISTRY.get_sample_value("koordqos_bus_request_seconds_count", {"type": call_name})
    hooks = REGISTRY.get_sample_value(
        "koordqos_runtime_hook_seconds_count", {"hook": hook, "stage": STAGE.value}
    )
    return calls or 0.0, hooks or 0.0


def test_a_call_left_unsettled_books_nothing_until_it_settles_then_everything_once() -> None:
    """`start_call(settle=False)`: the caller replies first; the timings and the deferred work (a decision
    record) are done when it settles the call, once, and a failing piece of deferred work does not stop the
    others."""
    reg = HookRegistry()
    reg.register(STAGE, "settle-hook", "", trace_hook([], "settle-hook"))  # type: ignore[arg-type]
    done: list[str] = []

    def fail() -> None:
        raise RuntimeError("bookkeeping bug")

    def body(call: Call) -> None:
        run_stage(reg, call, STAGE, ctx())
        call.defer(done.append, "first")
        call.defer(fail)
        call.defer(done.append, "after the failure")

    before = _timings("SettleLater", "settle-hook")
    call = start_call("SettleLater", 1.0, "Ignore", body, settle=False)
    assert isinstance(call, Call)
    assert call.ran == ["settle-hook"]
    assert _timings("SettleLater", "settle-hook") == before
    assert done == []
    call.settle()
    assert _timings("SettleLater", "settle-hook") == (before[0] + 1, before[1] + 1)
    assert done == ["first", "after the failure"]
    call.settle()  # a second time: nothing more
    assert _timings("SettleLater", "settle-hook") == (before[0] + 1, before[1] + 1)
    assert done == ["first", "after the failure"]


def test_failing_bookkeeping_is_counted_every_time_and_logged_once() -> None:
    def broken_record() -> None:
        raise KeyError("no such decision ring")

    labels = {"component": "runtime-call-bookkeeping", "kind": "KeyError"}
    before = REGISTRY.get_sample_value("koordqos_errors_total", labels) or 0.0
    with capture_logs() as logs:
        for _ in range(3):
            call = start_call(
                "Bookkeeping", 1.0, "Ignore", lambda call: call.defer(broken_record), settle=False
            )
            assert isinstance(call, Call)
            call.settle()
    assert REGISTRY.get_sample_value("koordqos_errors_total", labels) == before + 3
    failed = [e for e in logs if e["event"] == "runtime call bookkeeping failed"]
    assert len(failed) == 1
    assert failed[0]["request"] == "Bookkeeping"
    assert "no such decision ring" in failed[0]["error"]


def test_a_call_that_raises_settles_even_when_its_caller_would_have() -> None:
    """Under Fail a hook failure raises out of `start_call`: the caller gets no Call to settle, so the call
    settles before it raises (its timings are not lost)."""
    reg = HookRegistry()

    def broken(c: PodContext) -> None:
        raise ValueError("boom")

    reg.register(STAGE, "raising-hook", "", broken)  # type: ignore[arg-type]
    before = _timings("RaisingCall", "raising-hook")
    with pytest.raises(HookError):
        start_call("RaisingCall", 1.0, "Fail", lambda call: run_stage(reg, call, STAGE, ctx()), settle=False)
    assert _timings("RaisingCall", "raising-hook") == (before[0] + 1, before[1] + 1)


async def test_a_body_that_waits_leaves_the_rest_of_its_call_in_the_call() -> None:
    """An async body: `start_call` returns the Call at once with `rest`, the coroutine that ends it; awaiting
    it ends and settles the call, and the call then drops it (the two do not keep each other)."""
    gate = asyncio.Event()
    done: list[str] = []

    async def body(call: Call) -> None:
        call.defer(done.append, "settled")
        await gate.wait()
        call.ran.append("waited")

    call = start_call("Waits", 1.0, "Ignore", body, settle=False)
    rest = call.rest
    assert rest is not None
    assert (call.ran, call.took, done) == ([], -1.0, [])  # not started yet: the caller runs it
    gate.set()
    await rest
    assert call.ran == ["waited"]
    assert done == ["settled"]  # `rest` settles the call itself
    assert call.rest is None
    synchronous = start_call("NoWait", 1.0, "Ignore", lambda call: None)
    assert synchronous.rest is None


async def test_the_rest_of_a_waiting_call_raises_under_fail() -> None:
    async def hang(call: Call) -> None:
        await asyncio.Event().wait()

    call = start_call("WaitsTooLong", 0.02, "Fail", hang)
    assert call.rest is not None
    with pytest.raises(TimeoutException):
        await call.rest
    assert call.timed_out
