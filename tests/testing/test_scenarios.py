"""The mock runtime's `--scenario colocation` demo (issue #15 item 11), run as the README says: the mock
runtime and the agent command it prints, both real subprocesses; /debug/decisions shows per-pod hook and
strategy decisions and the agent logs no warning."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from koordqos.testing.poll import wait_until
from tests.support.agentproc import AgentLaunch, AgentPopen, agent_env, free_port

pytestmark = pytest.mark.e2e


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


async def test_colocation_scenario_shows_per_pod_hook_and_strategy_decisions(tmp_path: Path) -> None:
    sock = tmp_path / "nri.sock"
    node_dir = tmp_path / "node"
    env = agent_env(home=tmp_path)  # local mode
    mock = [sys.executable, "-m", "koordqos.testing.mock_nri", "--socket", str(sock)]
    runtime = subprocess.Popen(
        [*mock, "--scenario", "colocation", "--node-dir", str(node_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    agent: AgentPopen | None = None
    try:
        assert runtime.stdout is not None
        lines = [runtime.stdout.readline() for _ in range(3)]
        command = lines[2].strip()
        assert command.startswith(".venv/bin/python -m koordqos run"), lines
        port = free_port()
        argv = shlex.split(command)
        argv[0] = sys.executable  # the interpreter running this test (the venv's, in CI)
        argv[argv.index("--http-addr") + 1] = f"127.0.0.1:{port}"
        agent = AgentPopen(AgentLaunch([*argv, "--log-format", "json"], tmp_path / "agent.log", port, env))
        agent.start()
        decisions: list[dict[str, Any]] = []

        async with aiohttp.ClientSession() as session:

            async def seen_all() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/debug/decisions") as resp:
                        body = await resp.json()
                except (aiohttp.ClientError, ValueError):
                    return False
                decisions[:] = body if isinstance(body, list) else body.get("decisions", [])
                text = json.dumps(decisions)
                return all(
                    needle in text
                    for needle in (
                        "default/batch-job/worker",
                        "shares=1024 memory=2147483648",
                        "cpus=0-1",
                        "kubepods/besteffort/cpu.cfs_quota_us",
                    )
                ) and any(
                    d["target"].endswith("pod00000003-1a2b-4c3d-8e9f-000000000003/cpu.bvt_warp_ns")
                    for d in decisions
                )

            await wait_until(seen_all, timeout=60, interval=0.2, message="the scenario's decisions")
        by_target = {(d["strategy"], d["target"]): d for d in decisions}
        suppress = by_target[("BECPUSuppress", "kubepods/besteffort/cpu.cfs_quota_us")]
        assert suppress["new"] == "260000"  # 65 % of 4 CPUs on the idle synthetic node
        be_bvt = next(d for d in decisions if d["target"].endswith("000000000003/cpu.bvt_warp_ns"))
        ls_bvt = next(d for d in decisions if d["target"].endswith("000000000001/cpu.bvt_warp_ns"))
        assert (be_bvt["new"], ls_bvt["new"]) == ("-1", "2")
        # it really wrote the synthetic node (no --dry-run), and nothing else
        quota = node_dir / "cgroup" / "cpu" / "kubepods" / "besteffort" / "cpu.cfs_quota_us"
        assert quota.read_text().strip() == "260000"
    finally:
        out = ""
        if agent is not None:
            agent.stop(10)
            out = agent.log_text()
        _stop(runtime)
    levels = [json.loads(line).get("level") for line in out.splitlines() if line.startswith("{")]
    assert levels, out
    assert not [lv for lv in levels if lv in ("warning", "error", "critical")], out


def test_the_readme_shows_the_command_the_scenario_prints(tmp_path: Path) -> None:
    from koordqos.testing.mock_nri.scenarios import colocation

    printed = colocation(tmp_path).agent_command("/tmp/nri.sock").replace(str(tmp_path), "/tmp/koordqos-demo")
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert printed in readme
    assert (
        ".venv/bin/python -m koordqos.testing.mock_nri --socket /tmp/nri.sock --scenario colocation" in readme
    )
