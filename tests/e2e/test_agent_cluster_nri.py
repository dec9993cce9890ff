"""The agent as a real subprocess in cluster mode: fake API server, mock NRI runtime, synthetic node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from koordqos.model.pod import parse_pod
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_pod
from koordqos.testing.nodefs import SyntheticNode
from tests.support.agentproc import AgentLaunch, AsyncAgent, cluster_agent_argv, free_port
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_pod

pytestmark = pytest.mark.e2e
NODE = "e2e-node"
GI = 1 << 30


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
async def test_be_pod_from_the_api_gets_batch_limits_over_nri(tmp_path: Path, event_loop: str) -> None:
    node = SyntheticNode(tmp_path / "node")
    api = FakeAPIServer()
    await api.start()
    api.upsert("nodes", make_node(NODE))
    sandbox = sample_pod(7, "besteffort")
    sandbox.labels["koordinator.sh/qosClass"] = "BE"  # the kubelet gives the sandbox the pod's labels
    raw = make_pod(
        sandbox.name,
        NODE,
        uid=sandbox.uid,
        qos="BE",
        requests={"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "4Gi"},
        limits={"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"},
    )
    api.upsert("pods", raw)
    pod_dir = node.add_pod(parse_pod(raw))
    assert f"/{pod_dir}" == sandbox.linux.cgroup_parent  # the runtime and the layout agree on the dir
    runtime = MockRuntime(tmp_path / "nri.sock")
    await runtime.start()
    port = free_port()
    kubeconfig = api.write_kubeconfig(tmp_path / "kc")
    cmd = cluster_agent_argv(
        kubeconfig, NODE, node, port, "--nri-socket", str(tmp_path / "nri.sock"), "--event-loop", event_loop
    )
    agent = await AsyncAgent(AgentLaunch(cmd, tmp_path / "agent.log", port)).start()
    try:
        await runtime.wait_joined(timeout=30)
        await agent.wait_ready(30)
        await runtime.run_pod_sandbox(sandbox)
        # pod-level values are written before RunPodSandbox is answered
        assert node.read(pod_dir, "cpu", "cpu.cfs_quota_us") == "200000"
        assert node.read(pod_dir, "cpu", "cpu.shares") == "1536"
        assert node.read(pod_dir, "memory", "memory.limit_in_bytes") == str(4 * GI)
        ctr = sample_container(sandbox, 0)
        ctr.name = "main"  # the API pod's container
        resp = await runtime.create_container(sandbox, ctr)
        assert resp is not None
        res = resp.adjust.linux.resources
        assert (res.cpu.quota.value, res.cpu.shares.value, res.memory.limit.value) == (200000, 1536, 4 * GI)
        assert await agent.stop(10) == 0
        first = json.loads(agent.log_text().splitlines()[0])
        assert (first["event"], first["event_loop"]) == ("koordqos starting", event_loop)
    finally:
        await agent.stop()
        await runtime.stop()
        await api.stop()
