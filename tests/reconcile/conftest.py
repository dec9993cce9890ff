"""The agent in-process with the reconcile strategies, in both drivers, on synthetic v1 and v2 nodes.

* cluster mode: pods, Node and NodeSLO from the project's fake API server (real HTTP watch);
* local mode: pods over NRI from the mock runtime (real unix socket), NodeSLO from `--nodeslo-file`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from koordqos.agent import Agent
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer

NODE = "node-1"
INTERVAL = 0.05
VERSIONS = [
    pytest.param((CgroupVersion.V1, CgroupDriver.CGROUPFS), id="v1-cgroupfs"),
    pytest.param((CgroupVersion.V2, CgroupDriver.SYSTEMD), id="v2-systemd"),
]


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `cond` until true (the project's one polling helper; fails naming `what` after `timeout`)."""
    await wait_until(cond, timeout=timeout, message=what)


def rounds_of(agent: Agent, strategy: str) -> int:
    """How many rounds a strategy completed."""
    assert agent.parts.qos_manager is not None
    return int(agent.parts.qos_manager.runners[strategy].runs)


async def more_rounds(agent: Agent, strategy: str, n: int = 2) -> None:
    """Wait until `strategy` ran `n` more rounds (so a state it saw is applied)."""
    start = rounds_of(agent, strategy)
    await wait_for(lambda: rounds_of(agent, strategy) >= start + n, what=f"{n} rounds of {strategy}")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temp dir with a short path (unix socket paths are limited to ~108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="kqrec-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def server() -> AsyncIterator[FakeAPIServer]:
    srv = FakeAPIServer()
    await srv.start()
    yield srv
    await srv.stop()


def _tree(node: SyntheticNode, gates: dict[str, bool], **overrides: Any) -> dict[str, Any]:
    tree: dict[str, Any] = {
        "paths": {
            "cgroup_root": str(node.cgroup_root),
            "proc_root": str(node.proc_root),
            "sys_root": str(node.sys_root),
        },
        "metrics": {"collect_interval_seconds": INTERVAL},
        "qos": {"reconcile_interval_seconds": INTERVAL},
        "feature_gates": gates,
    }
    tree.update(overrides)
    return tree


@contextlib.asynccontextmanager
async def cluster_agent(
    base: Path, server: FakeAPIServer, node: SyntheticNode, gates: dict[str, bool], **overrides: Any
) -> AsyncIterator[Agent]:
    """Cluster mode: cgroups, metrics, kube (fake API server), strategies."""
    kubeconfig = server.write_kubeconfig(base / "kubeconfig")
    tree = _tree(node, gates, **overrides)
    tree["kube"] = {"kubeconfig": str(kubeconfig), "node_name": NODE}
    tree["nri"] = {"enabled": False}
    agent = Agent(build_config(tree), local_mode=False, packages=("metrics", "kube", "strategies"))
    agent.build()
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.ready, what="agent ready")
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def local_agent(
    base: Path, node: SyntheticNode, nodeslo: dict[str, Any], gates: dict[str, bool], **overrides: Any
) -> AsyncIterator[tuple[Agent, MockRuntime, Path]]:
    """Local mode: pods over NRI from the mock runtime, the NodeSLO from a file (returned for edits)."""
    slo_file = base / "nodeslo.json"
    slo_file.write_text(json.dumps(nodeslo))
    sock = base / "nri.sock"
    runtime = MockRuntime(sock, runtime_name="containerd")
    await runtime.start()
    tree = _tree(node, gates, **overrides)
    tree["kube"] = {"node_name": "local-node", "nodeslo_file": str(slo_file)}
    tree["nri"] = {"socket": str(sock), "backoff_seconds": 0.05, "backoff_cap_seconds": 0.2}
    agent = Agent(build_config(tree), local_mode=True, packages=("metrics", "kube", "nri", "strategies"))
    task = asyncio.create_task(agent.run())
    try:
        await runtime.wait_joined(timeout=10)
        yield agent, runtime, slo_file
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        await runtime.stop()
