"""Issue #32 item 5 a, b, h through the README's colocation scenario: the agent as a real subprocess, the mock
NRI runtime (in this process) on a real unix socket, the synthetic node the scenario lays out.

* a: with the NodeSLO applied before the pods, the LSR container dir gets its pod's bvt (2); a restarted agent
  over the configured node writes no bvt value at all (before: `2 -> 0` on the LSR pod dir, reason
  NodeSLOUpdated), also with `--enable-nri=false` (before: `2 -> 0`, never undone);
* b: the Synchronize answer for `web/nginx` is the cpuset the reconciler then keeps (before: `cpus=0-3`
  answered, `0-3 -> 2-3` written by the reconciler);
* h: the "NRI synchronized" line counts the pods and containers (before: 0/0); the NRI updates are logged as
  decisions (before: recorded without a log line).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.scenarios import Scenario, colocation
from koordqos.testing.poll import wait_until
from tests.support.agentproc import AgentLaunch, AgentPopen, agent_env, free_port

pytestmark = pytest.mark.e2e

BVT = "cpu.bvt_warp_ns"


class Agent:
    """One agent process of the scenario; its JSON log lines in a file (no pipe to fill)."""

    def __init__(self, scenario: Scenario, sock: Path, log: Path, *extra: str) -> None:
        self.port = free_port()
        argv = shlex.split(scenario.agent_command(str(sock), f"127.0.0.1:{self.port}"))
        argv[0] = sys.executable
        self.log = log
        cmd = [*argv, "--log-format", "json", *extra]
        self.proc = AgentPopen(AgentLaunch(cmd, log, self.port, agent_env(home=log.parent))).start()  # local
        self.url = f"http://127.0.0.1:{self.port}"

    async def get(self, path: str) -> Any:
        async with aiohttp.ClientSession() as http, http.get(self.url + path) as resp:
            if path == "/metrics":
                return await resp.text()
            return await resp.json()

    async def decisions(self) -> list[dict[str, Any]]:
        body = await self.get("/debug/decisions")
        return list(body if isinstance(body, list) else body.get("decisions", []))

    async def passes(self) -> dict[str, float]:
        """Reconciler passes by trigger, from /metrics."""
        out: dict[str, float] = {}
        for line in (await self.get("/metrics")).splitlines():
            if line.startswith("koordqos_hooks_reconcile_passes_total{"):
                trigger = line.split('trigger="', 1)[1].split('"', 1)[0]
                out[trigger] = float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM, wait, and the JSON log lines."""
        if self.proc.returncode is None:
            assert self.proc.stop(20) == 0
        self.proc.stop()  # the log closed
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]


async def answered(agent: Agent, what: Any) -> bool:
    try:
        return bool(await what())
    except (aiohttp.ClientError, ValueError, KeyError):
        return False


def bvt_writes(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in decisions if d["target"].endswith("/" + BVT) and d["action"] == "write"]


async def test_colocation_restart_keeps_bvt_and_one_cpuset_from_sync_to_reconcile(tmp_path: Path) -> None:
    scenario = colocation(tmp_path / "node")
    node = scenario.node
    _web, db, _batch = scenario.pods
    nginx, postgres, _worker = scenario.containers
    db_dir = node.layout.normalize_parent(db.linux.cgroup_parent)
    postgres_dir = node.layout.normalize_parent(postgres.linux.cgroups_path)
    nginx_dir = node.layout.normalize_parent(nginx.linux.cgroups_path)
    sock = tmp_path / "nri.sock"
    runtime = MockRuntime(sock)
    runtime.pods, runtime.containers = scenario.pods, scenario.containers
    await runtime.start()
    agents: list[Agent] = []
    try:
        # -- first start: the NodeSLO file is read before the runtime's pods arrive ---------------------
        agent = Agent(scenario, sock, tmp_path / "agent1.log")
        agents.append(agent)
        link = await runtime.wait_joined(timeout=60)
        answer = {u.container_id: u.linux.resources.cpu.cpus for u in link.sync_updates}

        async def reconciled() -> bool:
            # the reconciler has applied the LS pod's cpuset and the LSR pod's bvt (both before and after
            # the fix); then the assertions below tell the two apart
            cpus = node.read(nginx_dir, "cpuset", "cpuset.cpus")
            decided = any(d["target"] == f"{nginx_dir}/cpuset.cpus" for d in await agent.decisions())
            return node.read(db_dir, "cpu", BVT) == "2" and cpus in ("2-3", "0-3") and decided

        await wait_until(lambda: answered(agent, reconciled), timeout=60, interval=0.2, message="reconciled")
        # b: LS containers get the share pool (the CPUs the LSR pod does not hold exclusively), at the
        # Synchronize and in the reconciler alike
        assert answer[nginx.id] == "2-3", answer
        assert node.read(nginx_dir, "cpuset", "cpuset.cpus") == "2-3"
        first = await agent.decisions()
        nginx_values = {d["new"] for d in first if d["target"] == f"{nginx_dir}/cpuset.cpus"}
        assert nginx_values == {"2-3"}, nginx_values  # no other value decided for it, ever
        # a: the LSR container dir follows its pod (it stayed 0 when the NodeSLO came before the pods)
        assert node.read(postgres_dir, "cpu", BVT) == "2"
        logs = agent.stop()
        synced = [line for line in logs if line.get("event") == "NRI synchronized"]
        # h: the real counts (0/0 before: the lists were emptied before the line was logged)
        assert [(s["pods"], s["containers"]) for s in synced] == [(3, 3)], synced
        # h: the NRI answer is logged like every other decision
        nri_logged = [
            line
            for line in logs
            if (line.get("event"), line.get("action"), line["level"]) == ("decision", "nri-update", "info")
        ]
        targets = {line["target"] for line in nri_logged}
        assert targets >= {"default/web/nginx", "default/db/postgres"}, nri_logged
        web_line = next(line for line in nri_logged if line["target"] == "default/web/nginx")
        assert web_line["new"] == "cpus=2-3"
        assert web_line["reason"] == "Synchronize"

        values = {rel: node.read(rel, "cpu", BVT) for rel in (db_dir, postgres_dir)}
        assert values == {db_dir: "2", postgres_dir: "2"}

        # -- restart over the configured node: no bvt value written, not even for a moment -------------
        joined = len(runtime.links)
        agent = Agent(scenario, sock, tmp_path / "agent2.log")
        agents.append(agent)
        await runtime.wait_joined(timeout=60, after=joined)

        async def planned_after_sync() -> bool:
            passes = await agent.passes()
            # a pass that saw the runtime's pods (whatever woke it), after the passes of the start
            return sum(passes.values()) >= 3 and any(
                passes.get(t, 0) for t in ("RuntimeSynchronized", "PodsReplaced", "SourceSynced", "interval")
            )

        await wait_until(
            lambda: answered(agent, planned_after_sync), timeout=60, interval=0.2, message="pass"
        )
        assert bvt_writes(await agent.decisions()) == []
        assert {rel: node.read(rel, "cpu", BVT) for rel in (db_dir, postgres_dir)} == values
        agent.stop()

        # -- restart without NRI: no pod is known, none is given a value derived from that -------------
        agent = Agent(scenario, sock, tmp_path / "agent3.log", "--enable-nri=false")
        agents.append(agent)

        async def rule_seen() -> bool:
            # the start pass and the NodeSLO pass (or an interval pass): one of them had the bvt rule
            return sum((await agent.passes()).values()) >= 2

        await wait_until(lambda: answered(agent, rule_seen), timeout=60, interval=0.2, message="two passes")
        assert bvt_writes(await agent.decisions()) == []
        assert {rel: node.read(rel, "cpu", BVT) for rel in (db_dir, postgres_dir)} == values
        assert not [line for line in agent.stop() if line.get("level") in ("warning", "error", "critical")]
    finally:
        for a in agents:
            a.proc.stop()
        await runtime.stop()
