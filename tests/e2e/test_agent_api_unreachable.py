"""An API server unreachable at start (#32 5e): the agent backs off, answers /readyz 503, and no QoS strategy
or reconciler acts on the node until pods, Node and NodeSLO have synced once; then it converges.

The agent is a real subprocess in cluster mode on a synthetic node; the fake API server first does not listen
(connections refused), then serves the pods and the Node while every NodeSLO request gets 503, then serves
everything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until
from tests.support.agentproc import AgentLaunch, AsyncAgent, cluster_agent_argv, free_port
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodeslo, make_pod

pytestmark = pytest.mark.e2e
NODE = "e2e-node"
GI = 1 << 30


def _cgroup_files(node: SyntheticNode) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(node.cgroup_root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(node.cgroup_root))] = path.read_text()
    return out


def _changed(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    return {
        k: (before.get(k), after.get(k))
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }


def _lines(log: Path) -> list[dict[str, Any]]:
    """The agent's JSON log lines so far (a line being written is left for the next read)."""
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _logged(log: Path, event: str, **fields: str) -> int:
    """How many lines logged `event` with `fields`."""
    return sum(
        1
        for line in _lines(log)
        if line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
    )


class Agent:
    """The agent's HTTP endpoints."""

    def __init__(self, http: aiohttp.ClientSession, port: int) -> None:
        self.http = http
        self.base = f"http://127.0.0.1:{port}"

    async def get(self, path: str) -> tuple[int, Any] | None:
        try:
            async with self.http.get(self.base + path) as resp:
                return resp.status, await resp.json()
        except aiohttp.ClientError:
            return None

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        got = await self.get("/readyz")
        assert got is not None
        return got

    async def decisions(self) -> list[dict[str, Any]]:
        got = await self.get("/debug/decisions")
        assert got is not None
        body = got[1]
        return list(body["decisions"] if isinstance(body, dict) else body)


async def test_nothing_acts_on_the_node_until_pods_node_and_nodeslo_synced(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    raw = make_pod(
        "be",
        NODE,
        uid="uid-be",
        qos="BE",
        requests={"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "4Gi"},
        limits={"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"},
    )
    pod_dir = node.add_pod(parse_pod(raw))
    api = FakeAPIServer()
    api.port = free_port()  # the kubeconfig points here; nothing listens yet
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    before = _cgroup_files(node)
    port = free_port()
    argv = cluster_agent_argv(
        kubeconfig, NODE, node, port, "--enable-nri=false", "--debug-endpoints", "--collect-interval", "0.2"
    )
    agent_log = tmp_path / "agent.log"
    proc = await AsyncAgent(AgentLaunch(argv, agent_log, port)).start()
    try:
        async with aiohttp.ClientSession() as http:
            agent = Agent(http, port)

            # 1. nothing listens: the reflectors back off, /readyz is 503, nothing is written or decided (CPU
            # burst's first round would record the node's state at once)
            async def answering() -> bool:
                return await agent.get("/healthz") is not None

            await wait_until(answering, timeout=60, interval=0.1, message="the agent's HTTP endpoints")
            await wait_until(
                lambda: _logged(agent_log, "list/watch failed; backing off", resource="nodeslo") >= 2,
                timeout=30,
                message="the NodeSLO reflector refused twice",
            )
            status, body = await agent.readyz()
            assert (status, body["synced"]) == (503, [])
            assert body["waiting_for_sync"] == "node, nodeslo, pods"
            assert await agent.decisions() == []
            assert _changed(before, _cgroup_files(node)) == {}

            # 2. pods and Node served, every NodeSLO request 503: still nothing acts (the BE pod's limits
            # would be written from the pods alone)
            api.fail_next("nodeslos", 503, times=10**9)
            api.upsert("nodes", make_node(NODE))
            api.upsert("pods", raw)
            api.upsert(
                "nodeslos",
                make_nodeslo(
                    NODE, {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}}
                ),
            )
            await api.start()

            async def pods_and_node_synced() -> bool:
                return (await agent.readyz())[1]["synced"] == ["node", "pods"]

            await wait_until(pods_and_node_synced, timeout=60, interval=0.1, message="pods and Node synced")
            nodeslo_gets = api.count_requests(lambda m, p, q: "nodeslos" in p)
            await wait_until(
                lambda: api.count_requests(lambda m, p, q: "nodeslos" in p) >= nodeslo_gets + 3,
                timeout=30,
                message="three more NodeSLO requests answered 503 (the agent backs off and retries)",
            )
            status, body = await agent.readyz()
            assert (status, body["waiting_for_sync"]) == (503, "nodeslo")
            assert await agent.decisions() == []
            assert _changed(before, _cgroup_files(node)) == {}

            # 3. the NodeSLO served: ready, and the strategies and the reconciler converge
            api.clear_failures()

            async def ready() -> bool:
                return (await agent.readyz())[0] == 200

            await wait_until(ready, timeout=60, interval=0.1, message="/readyz 200")
            await wait_until(
                lambda: (
                    node.read(pod_dir, "cpu", "cpu.shares") == "1536"
                    and node.read(pod_dir, "memory", "memory.limit_in_bytes") == str(4 * GI)
                ),
                timeout=30,
                message="the reconciler wrote the BE pod's batch limits",
            )

            async def strategies_decided() -> bool:
                return {"CPUBurst", "runtime-hooks"} <= {d["strategy"] for d in await agent.decisions()}

            # CPU burst's first round records the node's state; the reconciler's writes are decisions too
            await wait_until(
                strategies_decided, timeout=30, interval=0.1, message="CPU burst and the reconciler"
            )
            assert "waiting_for_sync" not in (await agent.readyz())[1]
        assert await proc.stop(15) == 0
        lines = _lines(agent_log)
        events = [line["event"] for line in lines]
        waiting = events.index("waiting for the node's sources before acting on the node")
        synced = events.index("node sources synced; starting what acts on the node")
        assert waiting < synced
        assert sorted(lines[waiting]["components"]) == ["hooks-reconciler", "qos-manager"]
        assert "qos manager started" not in events[:synced]
    finally:
        await proc.stop()
        await api.stop()
