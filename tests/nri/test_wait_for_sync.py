"""`--runtime-hooks-wait-for-sync` (koordlet's order): the NRI plugin connects only once pods, Node and
NodeSLO have synced; by default it answers the runtime from the start (project decision, docs/security.md)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from koordqos.agent import Agent
from koordqos.config import build_config
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer, make_node

NODE = "n1"


@pytest.mark.parametrize("wait_for_sync", [True, False])
async def test_the_nri_plugin_waits_for_the_sync_only_when_asked(tmp_path: Path, wait_for_sync: bool) -> None:
    node = SyntheticNode(tmp_path / "node")
    short = Path(tempfile.mkdtemp(prefix="kq-", dir="/tmp"))
    api = FakeAPIServer()
    await api.start()
    api.upsert("nodes", make_node(NODE))
    api.fail_next("nodeslos", 503, times=10**9)
    runtime = MockRuntime(short / "nri.sock")
    await runtime.start()
    cfg = build_config(
        {
            "kube": {"kubeconfig": str(api.write_kubeconfig(tmp_path / "kc")), "node_name": NODE},
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "nri": {"socket": str(short / "nri.sock"), "backoff_seconds": 0.05},
            "hooks": {"wait_for_sync": wait_for_sync},
        }
    )
    agent = Agent(cfg, packages=("kube", "hooks", "nri"), local_mode=False)
    agent.build()
    run = asyncio.create_task(agent.run())
    try:
        await wait_until(
            lambda: agent.state.synced >= {"pods", "node"}, timeout=10, message="pods, Node synced"
        )
        asked = api.count_requests(lambda m, p, q: "nodeslos" in p)
        await wait_until(
            lambda: api.count_requests(lambda m, p, q: "nodeslos" in p) >= asked + 2,
            timeout=10,
            message="the NodeSLO refused twice more",
        )
        if wait_for_sync:
            assert runtime.links == []  # not even connected: the runtime runs without the plugin meanwhile
        else:
            await runtime.wait_joined(timeout=10)  # answering from the start
        assert "nodeslo" not in agent.state.synced
        assert not agent.ready
        api.clear_failures()
        await wait_until(lambda: agent.ready, timeout=10, message="ready")
        await runtime.wait_joined(timeout=10)
    finally:
        agent.stop()
        await asyncio.wait_for(run, 10)
        await runtime.stop()
        await api.stop()
        shutil.rmtree(short, ignore_errors=True)
