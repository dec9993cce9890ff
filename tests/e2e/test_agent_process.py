"""The agent as a real subprocess in local mode against a synthetic node root."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import pytest

from tests.support.agentproc import AgentLaunch, AsyncAgent, agent_argv, agent_env, free_port

pytestmark = pytest.mark.e2e


def synthetic_root(tmp: Path) -> dict[str, Path]:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  100 0 100 1000 0 0 0 0 0 0\ncpu0 100 0 100 1000 0 0 0 0 0 0\n")
    (proc / "meminfo").write_text(
        "MemTotal:       8000000 kB\nMemFree:        4000000 kB\nMemAvailable:   6000000 kB\n"
    )
    cg = tmp / "cgroup"
    for sub in ("cpu", "cpuacct", "cpuset", "memory"):
        (cg / sub / "kubepods" / "besteffort").mkdir(parents=True)
    sys_root = tmp / "sys"
    (sys_root / "devices" / "system" / "cpu" / "cpu0" / "topology").mkdir(parents=True)
    return {"proc": proc, "cgroup": cg, "sys": sys_root}


async def test_local_mode_agent_serves_ready_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    roots = synthetic_root(tmp_path)
    port = free_port()
    env = agent_env(home=tmp_path)  # no ~/.kube/config: local mode
    cmd = agent_argv(
        "--http-addr",
        f"127.0.0.1:{port}",
        "--cgroup-root",
        str(roots["cgroup"]),
        "--proc-root",
        str(roots["proc"]),
        "--sys-root",
        str(roots["sys"]),
        "--nri-socket",
        str(tmp_path / "nri.sock"),
        "--node-name",
        "e2e-node",
        "--debug-endpoints",
        "--log-format",
        "json",
    )
    agent = await AsyncAgent(AgentLaunch(cmd, tmp_path / "agent.log", port, env)).start()
    try:
        await agent.wait_ready(30)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                body = await resp.json()
            assert body["ready"] is True
            assert body["mode"] == "local"
            assert body["nri_connected"] is False  # reported, does not gate readiness
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
            assert resp.status == 200
            assert "koordqos_event_loop_lag_seconds_bucket" in text
            assert "koordqos_ready 1.0" in text
            # the process's own figures, as every exporter has them (the agent's CPU and memory)
            rss = [ln for ln in text.splitlines() if ln.startswith("process_resident_memory_bytes ")]
            assert rss
            assert float(rss[0].split()[1]) > 10e6, rss
            assert "process_cpu_seconds_total " in text
            assert "python_info{" in text
            async with session.get(f"http://127.0.0.1:{port}/debug/state") as resp:
                state = await resp.json()
            assert state["node"]["name"] == "e2e-node"
            async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
        start = time.monotonic()
        rc = await agent.stop(10)
        assert rc == 0
        assert time.monotonic() - start < 5.0
    finally:
        await agent.stop()
    err = agent.log_text()
    first = json.loads(err.splitlines()[0])
    assert first["event"] == "koordqos starting"
    assert first["mode"] == "local"
