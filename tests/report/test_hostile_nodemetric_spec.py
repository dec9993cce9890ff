"""Issue #39: a hostile NodeMetric spec (NaN report interval, infinite or huge aggregate duration, an endless
Go duration) against the agent in-process and the fake API server. The nodemetric-reporter never crashes: the
field is rejected with one log line and a counted error, its default or last valid value is kept, and the
status is written again after the hostile spec arrived.

The fake serves what Python's json writes: `NaN` and `Infinity` literals (which the agent's JSON decoder
accepts, as it accepts `1e400`, read as infinity) and integers of any size. The report interval is the
reporter's injected sleep (a round every 0.1 s instead of koordlet's 30 s minimum) and the writer's rate
limits are lifted; the rest is the agent as it runs."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from koordqos import observability as obs
from koordqos.agent import Agent
from koordqos.config import build_config
from koordqos.kube.reportwriters import TokenBucket
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.testing.nodefs import GiB, SyntheticNode
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodemetric

NODE = "hostile-node"
REPORTER = "nodemetric-reporter"


@pytest.fixture
async def server() -> AsyncIterator[FakeAPIServer]:
    srv = FakeAPIServer()
    await srv.start()
    yield srv
    await srv.stop()


async def quick(_: float) -> None:
    await asyncio.sleep(0.1)


@asynccontextmanager
async def reporting_agent(tmp_path: Path, server: FakeAPIServer) -> AsyncIterator[NodeMetricReporter]:
    node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=8 * GiB)
    server.upsert("nodes", make_node(NODE, cpu="4", memory="8Gi"))
    tree: dict[str, Any] = {
        "kube": {"kubeconfig": str(server.write_kubeconfig(tmp_path / "kc")), "node_name": NODE},
        "paths": {
            "cgroup_root": str(node.cgroup_root),
            "proc_root": str(node.proc_root),
            "sys_root": str(node.sys_root),
        },
        "metrics": {"collect_interval_seconds": 0.05},
        "report": {"min_write_interval_seconds": 0},
        "nri": {"enabled": False},
    }
    agent = Agent(build_config(tree), local_mode=False, packages=("metrics", "kube", "report"))
    agent.build()
    assert agent.parts.reporters is not None
    reporter = agent.parts.reporters.nodemetric
    reporter.sleep = quick
    assert reporter.writer is not None
    reporter.writer.bucket = TokenBucket(1000.0, 1000)
    task = asyncio.create_task(agent.run())
    try:
        await wait_until(lambda: agent.ready, timeout=10, message="agent ready")
        yield reporter
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


def restarts() -> float:
    return obs.REGISTRY.get_sample_value("koordqos_component_restarts_total", {"component": REPORTER}) or 0.0


def rejected() -> float:
    labels = {"kind": "NodeMetric"}
    return obs.REGISTRY.get_sample_value("koordqos_report_invalid_fields_total", labels) or 0.0


def status_puts(server: FakeAPIServer) -> int:
    return server.count_requests(lambda m, p, q: m == "PUT" and p.endswith(f"/nodemetrics/{NODE}/status"))


async def written_after(server: FakeAPIServer, puts: int) -> None:
    """A status PUT after `puts` of them, stored on the object."""
    await wait_until(lambda: status_puts(server) > puts, timeout=10, message="a status written")
    await wait_until(
        lambda: "status" in (server.get("nodemetrics", NODE) or {}), timeout=10, message="status stored"
    )


def aggregate(seconds: Any) -> dict[str, Any]:
    return make_nodemetric(NODE, {"metricCollectPolicy": {"aggregateDurationSeconds": seconds}})


def policy(reporter: NodeMetricReporter) -> tuple[int, int, tuple[float, ...]]:
    p = reporter.policy
    return p.aggregate_seconds, p.report_interval_seconds, p.durations


async def test_a_nan_interval_and_infinite_durations_never_stop_the_report(
    tmp_path: Path, server: FakeAPIServer
) -> None:
    spec = {"metricCollectPolicy": {"reportIntervalSeconds": math.nan, "aggregateDurationSeconds": 120}}
    server.upsert("nodemetrics", make_nodemetric(NODE, spec))
    before_restarts, before_rejected = restarts(), rejected()
    async with reporting_agent(tmp_path, server) as reporter:
        await written_after(server, 0)
        assert policy(reporter) == (120, 60, (300.0, 600.0, 1800.0))  # the interval: its default
        assert rejected() == before_rejected + 1

        # infinite and huge windows, an endless Go duration: each rejected, the status written again
        puts = status_puts(server)
        hostile = {
            "aggregateDurationSeconds": math.inf,
            "reportIntervalSeconds": 10**30,
            "nodeAggregatePolicy": {"durations": ["5m", "9" * 400 + "h"]},
        }
        server.upsert("nodemetrics", make_nodemetric(NODE, {"metricCollectPolicy": hostile}))
        await wait_until(lambda: rejected() >= before_rejected + 4, timeout=10, message="three more rejected")
        await written_after(server, status_puts(server))
        assert status_puts(server) > puts
        # unset fields are their defaults; the rejected ones keep their last valid value (120) or default
        assert policy(reporter) == (120, 60, (300.0, 600.0, 1800.0))
        assert rejected() == before_rejected + 4  # each problem counted when it appeared, not every round
        status = (server.get("nodemetrics", NODE) or {})["status"]
        assert [a["duration"] for a in status["nodeMetric"]["aggregatedNodeUsages"]] == [
            "5m0s",
            "10m0s",
            "30m0s",
        ]
    assert restarts() == before_restarts


@pytest.mark.parametrize(
    "bad",
    [math.nan, -math.inf, -5, 10**30, 120.5, "120", True, [120], {"seconds": 120}],
    ids=["nan", "-inf", "negative", "huge", "fraction", "string", "bool", "list", "object"],
)
async def test_a_rejected_aggregate_keeps_the_last_valid_value(
    tmp_path: Path, server: FakeAPIServer, bad: Any
) -> None:
    server.upsert("nodemetrics", aggregate(120))
    before, before_restarts = rejected(), restarts()
    async with reporting_agent(tmp_path, server) as reporter:
        await written_after(server, 0)
        assert policy(reporter)[0] == 120
        server.upsert("nodemetrics", aggregate(bad))
        await wait_until(lambda: rejected() == before + 1, timeout=10, message="the value rejected")
        puts = status_puts(server)
        await written_after(server, puts)
        assert policy(reporter)[0] == 120
        server.upsert("nodemetrics", aggregate(90))
        await wait_until(lambda: policy(reporter)[0] == 90, timeout=10, message="a valid value converges")
        assert rejected() == before + 1
    assert restarts() == before_restarts
