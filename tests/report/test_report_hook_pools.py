"""The CPUSetAllocator takes its share pools from the agent's NRT computation (the NRT worked example's node,
docs/reporting.md, "Share pools and reserved CPUs"), not from Node annotations; composed by the agent in local
mode (no cluster: the NRT is computed locally only, N6)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from koordqos.agent import Agent
from koordqos.config import build_config
from koordqos.events.types import NodeUpdated, PodUpserted
from koordqos.hooks.context import ContainerContext, ContainerRequest
from koordqos.hooks.cpuset import CPUSetAllocator
from koordqos.hooks.rules import CPUSharePool, NodeRules, topology_view
from koordqos.model.node import NodeInfo
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until
from koordqos.testing.topofs import write_topology

from .test_report_nrt import EXAMPLE_PODS

ANN_POOLS = "node.koordinator.sh/cpu-shared-pools"


def test_topology_rule_wins_over_node_annotations() -> None:
    h = CPUSetAllocator()
    node = NodeRules(None, {ANN_POOLS: '[{"socket":0,"node":0,"cpuset":"0-15"}]'})
    assert h.update_node(node)
    assert h.rule is not None
    assert h.rule.share_pools == (CPUSharePool(0, 0, "0-15"),)
    assert h.update_topology(topology_view({ANN_POOLS: '[{"socket":0,"node":0,"cpuset":"1"}]'}))
    assert not h.update_node(NodeRules(None, {ANN_POOLS: '[{"socket":0,"node":0,"cpuset":"0-3"}]'}))
    assert h.rule.share_pools == (CPUSharePool(0, 0, "1"),)


async def test_agent_feeds_the_hook_from_the_nrt_computation(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node", cpus=8)
    write_topology(node.sys_root, [(c, c // 2, 0, c // 4) for c in range(8)], {0: 16375892, 1: 16375892})
    cfg = build_config(
        {
            "kube": {"node_name": "node-a"},
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "server": {"http_addr": "127.0.0.1:0"},
            "report": {"node_topology_sync_interval_seconds": 0.05},
        }
    )
    agent = Agent(cfg, packages=("hooks", "report"), local_mode=True)
    agent.build()
    reporters = agent.parts.reporters
    assert reporters is not None
    assert reporters.topology.writer is None  # local mode: compute only
    cpuset = agent.services.hooks.cpuset
    assert cpuset is not None
    run = asyncio.create_task(agent.run())
    try:
        annotations = {"node.koordinator.sh/reservation": '{"reservedCPUs":"0"}'}
        await agent.bus.publish(NodeUpdated(node=NodeInfo(name="node-a", annotations=annotations)))
        for pod in EXAMPLE_PODS:
            await agent.bus.publish(PodUpserted(pod=pod))

        def pools() -> tuple[str, ...]:
            rule = cpuset.rule
            return () if rule is None else tuple(p.cpuset for p in rule.share_pools)

        await wait_until(
            lambda: pools() == ("1", "4-5"), timeout=10, message="the hook's LS pools from the NRT"
        )
        assert cpuset.rule is not None
        assert [p.cpuset for p in cpuset.rule.be_share_pools] == ["1-3", "4-5"]
        c = ContainerContext(
            ContainerRequest(pod_uid="u", container_name="c", pod_labels={"koordinator.sh/qosClass": "LS"})
        )
        cpuset.set_container_cpuset(c)
        assert c.response.resources.cpuset == "1,4-5"
        state = reporters.debug_state()
        assert state["nodeResourceTopology"]["pools"]["ls"][1] == {"socket": 0, "node": 1, "cpuset": "4-5"}
        assert json.dumps(state)  # JSON-serialisable for /debug/state
    finally:
        agent.stop()
        await asyncio.wait_for(run, 10)
