"""The agent as a real subprocess reporting to the fake API server (docs/reporting.md, "Reporting rules the
code refers to"): a synthetic node whose node and pod CPU counters advance at known rates and whose pods have
known anonymous memory; the NodeMetric status it writes (through a 409 that must be retried) matches within
tolerance and has every required field; no status before the node window has data; the NRT is created."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from koordqos.model.pod import parse_pod
from koordqos.model.quantity import to_int, to_milli
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until
from tests.support.agentproc import AgentLaunch, AsyncAgent, cluster_agent_argv, free_port
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodemetric, make_pod

pytestmark = pytest.mark.e2e
NODE = "report-node"
GI = 1 << 30
MI = 1 << 20
USER_HZ = 100
# pod name → (CPU cores, anonymous memory bytes)
LOAD = {"web-0": (1.5, 512 * MI), "db-0": (0.5, 256 * MI), "spark-1": (2.0, GI)}
NODE_CPU = 5.0  # cores busy on the node (pods 4.0 + system 1.0)


async def advance(node: SyntheticNode, dirs: dict[str, str], stop: asyncio.Event) -> None:
    """Advance every counter in proportion to elapsed time (so rates are exact whenever they are read)."""
    t0 = time.monotonic()
    done_ns = dict.fromkeys(dirs, 0)
    busy_done = idle_done = 0
    while not stop.is_set():
        elapsed = time.monotonic() - t0
        for name, rel in dirs.items():
            target = int(LOAD[name][0] * 1e9 * elapsed)
            node.add_cpu_usage(rel, target - done_ns[name])
            done_ns[name] = target
        busy = int(NODE_CPU * USER_HZ * elapsed)
        idle = int(8 * USER_HZ * elapsed) - busy
        node.advance_node_cpu(busy - busy_done, idle - idle_done)
        busy_done, idle_done = busy, idle
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


def _res(rm: dict[str, Any]) -> tuple[int, int]:
    return to_milli(rm["resources"]["cpu"]), to_int(rm["resources"]["memory"])


async def test_agent_reports_known_rates_and_skips_rounds_while_the_window_is_empty(tmp_path: Path) -> None:
    # two agents side by side: each waits for its first report round (the minimum interval, 30 s), so they
    # run at the same time instead of one after the other
    (tmp_path / "rates").mkdir()
    (tmp_path / "empty").mkdir()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(_reports_known_rates(tmp_path / "rates"))
        tg.create_task(_no_status_while_the_node_window_is_empty(tmp_path / "empty"))


async def _reports_known_rates(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node", cpus=8, memory_total=16 * GI)
    node.set_meminfo(16 * GI, 16 * GI - 3 * GI, 8 * GI)  # MemTotal − MemAvailable = 3 GiB
    api = FakeAPIServer()
    await api.start()
    api.upsert("nodes", make_node(NODE, cpu="8", memory="16Gi"))
    spec = {"metricCollectPolicy": {"reportIntervalSeconds": 30, "aggregateDurationSeconds": 60}}
    api.upsert("nodemetrics", make_nodemetric(NODE, spec))
    dirs: dict[str, str] = {}
    for name, (_, anon) in LOAD.items():
        be = name.startswith("spark")
        raw = make_pod(
            name,
            NODE,
            "batch" if be else "default",
            qos="BE" if be else None,
            uid=f"uid-{name}",
            requests={} if be else {"cpu": "1", "memory": "1Gi"},
        )
        api.upsert("pods", raw)
        rel = node.add_pod(parse_pod(raw))
        node.set_memory(rel, anon + 300 * MI, inactive_file=100 * MI, anon=anon, active_file=200 * MI)
        dirs[name] = rel
    # the first status PUT meets a conflict: the agent must GET again and retry
    api.fail_next("/nodemetrics/report-node/status", 409, method="PUT")
    stop = asyncio.Event()
    ticker = asyncio.create_task(advance(node, dirs, stop))
    port = free_port()
    kubeconfig = api.write_kubeconfig(tmp_path / "kc")
    cmd = cluster_agent_argv(kubeconfig, NODE, node, port, "--enable-nri=false", "--debug-endpoints")
    agent = await AsyncAgent(AgentLaunch(cmd, tmp_path / "agent.log", port)).start()
    try:
        await agent.wait_ready(60)

        def status() -> dict[str, Any] | None:
            obj = api.get("nodemetrics", NODE)
            return None if obj is None else obj.get("status")

        await wait_until(
            lambda: status() is not None, timeout=120, interval=0.2, message="a NodeMetric status"
        )
        got = status()
        assert got is not None
        # two PUTs to /status: the injected 409, then the retry after a fresh GET
        puts = api.count_requests(lambda m, p, q: m == "PUT" and p.endswith("/status"))
        assert puts == 2
        assert got["updateTime"]
        nm = got["nodeMetric"]
        for key in ("nodeUsage", "aggregatedNodeUsages", "systemUsage", "aggregatedSystemUsages"):
            assert key in nm
        assert [a["duration"] for a in nm["aggregatedNodeUsages"]] == ["5m0s", "10m0s", "30m0s"]
        for entry in nm["aggregatedNodeUsages"]:
            assert set(entry["usage"]) == {"avg", "p50", "p90", "p95", "p99"}
        cpu, mem = _res(nm["nodeUsage"])
        assert cpu == pytest.approx(NODE_CPU * 1000, rel=0.1)
        assert mem == 3 * GI
        pods = {p["name"]: p for p in got["podsMetric"]}
        assert set(pods) == set(LOAD)
        for name, (cores, anon) in LOAD.items():
            p = pods[name]
            assert {"namespace", "name", "podUsage", "priority", "qos"} <= set(p)
            pcpu, pmem = _res(p["podUsage"])
            assert pcpu == pytest.approx(cores * 1000, rel=0.1), name
            assert pmem == anon, name  # anonymous memory, not the working set
        assert (pods["spark-1"]["qos"], pods["spark-1"]["priority"]) == ("BE", "koord-batch")
        assert (pods["web-0"]["qos"], pods["web-0"]["priority"]) == ("LS", "koord-prod")
        sys_cpu, sys_mem = _res(nm["systemUsage"])
        assert sys_cpu == pytest.approx((NODE_CPU - 4.0) * 1000, abs=300)
        assert sys_mem == 3 * GI - (512 + 256 + 1024) * MI
        nrt = api.get("noderesourcetopologies", NODE)
        assert nrt is not None
        assert "node.koordinator.sh/cpu-shared-pools" in nrt["metadata"]["annotations"]
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/debug/state") as r:
            debug = await r.json()
        assert debug["status"]["report"]["nodeMetric"]["last"]["outcome"] == "written"
        assert debug["status"]["report"]["nodeMetric"]["last"]["writtenAt"] == got["updateTime"]
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
            metrics = await r.text()
        assert 'koordqos_report_conflicts_total{kind="NodeMetric"} 1.0' in metrics
        assert 'koordqos_report_writes_total{kind="NodeMetric",outcome="written"}' in metrics
        assert await agent.stop(10) == 0
    finally:
        stop.set()
        await ticker
        await agent.stop()
        await api.stop()


async def _no_status_while_the_node_window_is_empty(tmp_path: Path) -> None:
    """/proc/stat unreadable: no node CPU sample ever, so no status is written, rounds are skipped
    (docs/reporting.md, "No status over an empty window")."""
    node = SyntheticNode(tmp_path / "node")
    (node.proc_root / "stat").unlink()
    api = FakeAPIServer()
    await api.start()
    api.upsert("nodes", make_node(NODE))
    api.upsert("nodemetrics", make_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 30}}))
    port = free_port()
    kubeconfig = api.write_kubeconfig(tmp_path / "kc")
    cmd = cluster_agent_argv(kubeconfig, NODE, node, port, "--enable-nri=false")
    agent = await AsyncAgent(AgentLaunch(cmd, tmp_path / "agent.log", port)).start()
    try:
        await agent.wait_ready(60)
        async with aiohttp.ClientSession() as http:

            async def skipped() -> bool:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                return 'koordqos_report_writes_total{kind="NodeMetric",outcome="skipped"} 1.0' in text

            await wait_until(skipped, timeout=120, interval=0.5, message="a skipped NodeMetric round")
        obj = api.get("nodemetrics", NODE)
        assert obj is not None
        assert "status" not in obj
        assert api.count_requests(lambda m, p, q: m == "PUT") == 0
        assert await agent.stop(10) == 0
    finally:
        await agent.stop()
        await api.stop()


async def test_standalone_refused_when_a_nodemetric_exists(tmp_path: Path) -> None:
    """koord-manager is present (a NodeMetric exists): `--batch-resource-source=agent` exits 2, one line."""
    node = SyntheticNode(tmp_path / "node")
    api = FakeAPIServer()
    await api.start()
    api.upsert("nodes", make_node(NODE))
    api.upsert("nodemetrics", make_nodemetric(NODE))
    kubeconfig = api.write_kubeconfig(tmp_path / "kc")
    cmd = cluster_agent_argv(
        kubeconfig, NODE, node, free_port(), "--enable-nri=false", "--batch-resource-source=agent"
    )
    agent = await AsyncAgent(AgentLaunch(cmd, tmp_path / "agent.log")).start()
    try:
        assert await agent.wait(60) == 2
        err = agent.log_text()
        lines = [line for line in err.splitlines() if line.startswith("koordqos: error:")]
        assert len(lines) == 1
        assert "koord-manager" in lines[0]
        assert "Traceback" not in err
        assert api.count_requests(lambda m, p, q: m == "PATCH") == 0
    finally:
        await agent.stop()
        await api.stop()
