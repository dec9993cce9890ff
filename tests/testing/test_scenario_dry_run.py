"""`--dry-run` over the README's colocation scenario records what a real run records (issue #32 item 5g), the
NRI updates included, each decision once; and an agent restarted over the node it suppressed exports
`koordqos_be_suppress_cores` although it writes nothing. The mock runtime and the agent are real
subprocesses, as the README runs them."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from koordqos.testing.poll import wait_until
from tests.support.agentproc import AgentLaunch, AsyncAgent, agent_env, free_port
from tests.testing.test_scenarios import _stop

pytestmark = pytest.mark.e2e

QUOTA = "kubepods/besteffort/cpu.cfs_quota_us"
STEADY_ROUNDS = 5  # CPU-suppress rounds after its first decision, over the steady (idle) node
RUNS = re.compile(r'^koordqos_strategy_runs_total\{result="ok",strategy="BECPUSuppress"\} (\S+)$', re.M)
CORES = re.compile(r'^koordqos_be_suppress_cores\{policy="cfsQuota"\} (\S+)$', re.M)


@dataclass
class Run:
    decisions: list[dict[str, Any]]
    metrics: str
    output: str


def _runtime(tmp_path: Path, node_dir: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """The mock runtime serving the scenario; the agent's argv it prints."""
    cmd = [sys.executable, "-m", "koordqos.testing.mock_nri", "--socket", str(tmp_path / "nri.sock")]
    runtime = subprocess.Popen(
        [*cmd, "--scenario", "colocation", "--node-dir", str(node_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=agent_env(home=tmp_path),  # local mode
    )
    assert runtime.stdout is not None
    lines = [runtime.stdout.readline() for _ in range(3)]
    argv = shlex.split(lines[2].strip())
    assert argv[:4] == [".venv/bin/python", "-m", "koordqos", "run"], lines
    argv[0] = sys.executable
    return runtime, argv


def _runs(metrics: str) -> float:
    m = RUNS.search(metrics)
    return float(m.group(1)) if m else 0.0


async def _agent(tmp_path: Path, argv: list[str], *extra: str, suppressing: bool = True) -> Run:
    """Run the agent until CPU suppress decided (`suppressing`) and then ran STEADY_ROUNDS more rounds."""
    port = free_port()
    argv = list(argv)
    argv[argv.index("--http-addr") + 1] = f"127.0.0.1:{port}"
    cmd = [*argv, "--log-format", "json", *extra]
    agent = await AsyncAgent(AgentLaunch(cmd, tmp_path / "agent.log", port, agent_env(home=tmp_path))).start()
    run = Run([], "", "")
    start: list[float] = []
    try:
        async with aiohttp.ClientSession() as session:

            async def steady() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/debug/decisions") as resp:
                        body = await resp.json()
                    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        run.metrics = await resp.text()
                except (aiohttp.ClientError, ValueError):
                    return False
                run.decisions = body if isinstance(body, list) else body.get("decisions", [])
                if suppressing and not any(d["target"] == QUOTA for d in run.decisions):
                    return False
                if not start:
                    start.append(_runs(run.metrics))
                return _runs(run.metrics) >= start[0] + STEADY_ROUNDS

            await wait_until(steady, timeout=60, interval=0.2, message="steady CPU-suppress rounds")
    finally:
        await agent.stop(10)
        run.output = agent.log_text()
    return run


def _per_target(decisions: list[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """Each target's decisions in order (targets interleave differently from run to run: the reconciler's
    and the strategies' rounds and the NRI call race). A reconcile pass's trigger is left out of its reason
    (whether the NodeSLO file or the runtime's pods come first is a race of the start-up, not a decision)."""
    out: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
    for d in decisions:
        reason = "reconcile" if d["reason"].startswith("reconcile (") else d["reason"]
        out[(d["strategy"], d["target"])].append((d["action"], d["old"], d["new"], reason))
    return dict(out)


def _updates_sent(runtime_output: str) -> list[int]:
    return [int(n) for n in re.findall(r"plugin 00-koordqos joined: .* updates=(\d+)", runtime_output)]


async def test_dry_run_records_a_real_runs_decisions_once_and_changes_nothing(tmp_path: Path) -> None:
    runs, sent, quotas = {}, {}, {}

    async def run(name: str, *extra: str) -> None:
        node_dir = tmp_path / name / "node"
        runtime, argv = _runtime(tmp_path / name, node_dir)
        try:
            runs[name] = await _agent(tmp_path / name, argv, *extra)
        finally:
            sent[name] = _updates_sent(_stop(runtime))
        quotas[name] = (node_dir / "cgroup/cpu/kubepods/besteffort/cpu.cfs_quota_us").read_text()

    await asyncio.gather(run("real"), run("dry", "--dry-run"))  # side by side: two separate nodes
    real, dry = runs["real"], runs["dry"]
    assert {d["dry_run"] for d in real.decisions} == {False}
    assert {d["dry_run"] for d in dry.decisions} == {True}
    # the same decisions, target by target: NRI updates, reconciler writes, CPU suppress, CPU burst
    assert _per_target(dry.decisions) == _per_target(real.decisions)
    nri = [d for d in dry.decisions if d["action"] == "nri-update"]
    assert {d["target"] for d in nri} == {
        "default/web/nginx",
        "default/db/postgres",
        "default/batch-job/worker",
    }
    # the steady cap decided once, not every round (it was recorded again each of the STEADY_ROUNDS)
    assert [(d["old"], d["new"]) for d in dry.decisions if d["target"] == QUOTA] == [("-1", "260000")]
    # the runtime got the three updates from the real run, none from the dry-run; the files are as they were
    assert sent == {"real": [3], "dry": [0]}
    assert (quotas["real"].strip(), quotas["dry"].strip()) == ("260000", "-1")
    assert CORES.search(dry.metrics) is not None


async def test_a_restart_over_a_suppressed_node_exports_the_suppressed_cores(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    runtime, argv = _runtime(tmp_path, node_dir)
    try:
        first = await _agent(tmp_path, argv)
        assert [(d["old"], d["new"]) for d in first.decisions if d["target"] == QUOTA] == [("-1", "260000")]
        # the agent again (a new process: no gauge value yet), over the node it left at 260000
        again = await _agent(tmp_path, argv, suppressing=False)
    finally:
        _stop(runtime)
    assert [d for d in again.decisions if d["strategy"] == "BECPUSuppress"] == []  # nothing to write
    cores = CORES.search(again.metrics)
    assert cores is not None, again.metrics
    assert float(cores.group(1)) == 2.6
