"""Supervisor and Agent lifecycle: crashes restart with backoff; stop is prompt."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

import pytest

from koordqos.agent import Agent, FunctionComponent
from koordqos.config import build_config
from koordqos.process.supervisor import Supervisor
from koordqos.testing.agentrunner import AgentLaunch, AgentPopen
from koordqos.testing.poll import wait_until, wait_until_sync


async def test_crashing_component_is_restarted_and_counted() -> None:
    runs = 0
    healthy = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 4:
            raise RuntimeError(f"crash {runs}")
        healthy.set()
        await asyncio.Event().wait()

    sup = Supervisor(base_delay=0.001, max_delay=0.01)
    task = asyncio.create_task(sup.supervise(FunctionComponent("flaky", flaky)))
    await asyncio.wait_for(healthy.wait(), 5)
    assert runs == 4
    assert sup.crashes == {"flaky": 3}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_crash_loop_of_a_component_does_not_stop_the_agent() -> None:
    cfg = build_config({"server": {"http_addr": "127.0.0.1:0"}, "kube": {"node_name": "n"}})
    crashes = 0

    async def always_crash() -> None:
        nonlocal crashes
        crashes += 1
        raise RuntimeError("broken")

    agent = Agent(cfg, packages=(), local_mode=True)
    agent.supervisor = Supervisor(base_delay=0.001, max_delay=0.002)
    agent.build()
    agent.components.append(FunctionComponent("broken", always_crash))
    run = asyncio.create_task(agent.run())
    await wait_until(lambda: crashes >= 20, timeout=5, message="20 restarts of the crashing component")
    assert not run.done()
    agent.stop()
    await asyncio.wait_for(run, 5)


async def test_shutdown_steps_run_after_components_stop_even_if_one_fails() -> None:
    cfg = build_config({"server": {"http_addr": "127.0.0.1:0"}, "kube": {"node_name": "n"}})
    agent = Agent(cfg, packages=(), local_mode=True)
    agent.build()
    order: list[str] = []
    stopped = asyncio.Event()

    async def component() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append("component stopped")
            stopped.set()

    async def failing_step() -> None:
        order.append("failing step")
        raise RuntimeError("close failed")

    async def closing_step() -> None:
        order.append("close client")

    agent.components.append(FunctionComponent("c", component))
    agent.on_shutdown(closing_step)
    agent.on_shutdown(failing_step)
    started = asyncio.Event()
    agent.components.append(FunctionComponent("started", _set_and_wait(started)))
    run = asyncio.create_task(agent.run())
    await asyncio.wait_for(started.wait(), 5)
    agent.stop()
    await asyncio.wait_for(run, 5)
    assert stopped.is_set()
    assert order == ["component stopped", "failing step", "close client"]


async def test_a_component_that_loses_its_cancellation_still_stops_within_the_timeout() -> None:
    """asyncio.wait_for on Python 3.11 drops a cancellation that lands as its awaitable completes: the
    component goes on running. The agent cancels again: run() returns, within the shutdown timeout."""
    cfg = build_config(
        {"server": {"http_addr": "127.0.0.1:0"}, "kube": {"node_name": "n"}, "shutdown_timeout_seconds": 3}
    )
    agent = Agent(cfg, packages=(), local_mode=True)
    agent.build()
    started = asyncio.Event()
    lost = 0

    async def loses_one_cancellation() -> None:
        nonlocal lost
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            lost += 1  # as wait_for does when the wake-up and the cancellation coincide
        await asyncio.Event().wait()

    agent.components.append(FunctionComponent("loses-one", loses_one_cancellation))
    run = asyncio.create_task(agent.run())
    await asyncio.wait_for(started.wait(), 5)
    agent.stop()
    done, _ = await asyncio.wait({run}, timeout=10)
    if not done:
        run.cancel()
    assert done, "the agent waited for a component that lost its cancellation"
    assert lost == 1
    run.result()


STUCK_THREAD_AGENT = """
import asyncio, threading
from koordqos.agent import Agent, FunctionComponent, run
from koordqos.config import build_config

cfg = build_config(
    {"server": {"http_addr": "127.0.0.1:0"}, "kube": {"node_name": "n"}, "shutdown_timeout_seconds": 1}
)
agent = Agent(cfg, packages=(), local_mode=True)
agent.build()
never = threading.Event()

async def stuck_in_a_thread():
    print("started", flush=True)
    await asyncio.to_thread(never.wait)  # a worker thread stuck: cancelling frees the task only

agent.components.append(FunctionComponent("stuck", stuck_in_a_thread))
run(agent)
"""


def test_the_agent_process_exits_after_its_shutdown_timeout_whatever_still_runs(tmp_path: Path) -> None:
    """A worker thread that never returns: asyncio.Runner waits for the default executor at close, the
    interpreter for its threads. The process still ends, EXIT_GRACE_SECONDS after the shutdown timeout,
    with exit code 1 and one line saying why."""
    with AgentPopen(AgentLaunch([sys.executable, "-c", STUCK_THREAD_AGENT], tmp_path / "agent.log")) as proc:

        def started() -> bool:
            return "started" in proc.log_text().split("\n") or proc.returncode is not None

        wait_until_sync(started, 60, 0.05, "the agent's 'started' line")
        assert "started" in proc.log_text().split("\n"), proc.log_text()
        stopped_at = time.monotonic()
        code = proc.stop(60)  # SIGTERM
        took = time.monotonic() - stopped_at
    out = proc.log_text()
    assert code == 1, out
    assert "did not exit within its shutdown timeout" in out
    assert re.search(r"threads=\[.*'(asyncio|uvloop)_0'", out), out  # the stuck worker thread is named
    assert took >= 1 + 2 - 0.5  # it waited out the shutdown timeout and the grace first


def _set_and_wait(event: asyncio.Event):  # type: ignore[no-untyped-def]
    async def run() -> None:
        event.set()
        await asyncio.Event().wait()

    return run


def test_event_loop_choice_falls_back_to_the_stdlib_loop_and_runs_the_agent_on_uvloop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    import uvloop

    from koordqos.agent import loop_factory
    from koordqos.errors import ConfigError

    assert loop_factory("asyncio") is None
    assert loop_factory("auto") is uvloop.new_event_loop  # installed here (the test extra)
    assert loop_factory("uvloop") is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: importing it fails
    assert loop_factory("auto") is None  # the stdlib loop
    assert loop_factory("asyncio") is None
    with pytest.raises(ConfigError, match="not installed"):
        loop_factory("uvloop")


def test_an_interrupt_outside_the_agents_signal_handlers_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a second Ctrl-C while the loop closes after a stop (or one during start-up) reaches Python's default
    # handler as KeyboardInterrupt: it ended the agent process with a traceback
    from koordqos.agent import run

    agent = Agent(build_config({"kube": {"node_name": "n1"}}), packages=[], local_mode=True)

    async def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(agent, "run", interrupted)
    with pytest.raises(SystemExit) as exc:
        run(agent)
    assert exc.value.code == 130
    assert capsys.readouterr().err == "koordqos: interrupted\n"
