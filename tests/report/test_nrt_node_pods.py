"""The NRT (and so the CPUSetAllocator's share pools) counts the runtime's sandboxes no PodInfo stands for
yet: the NRI Synchronize delivers them before the local pod source or the API server (issue #32 item 5b)."""

from __future__ import annotations

import json
from pathlib import Path

from koordqos.bus import EventBus
from koordqos.events.records import RuntimeSandbox
from koordqos.events.types import PodsReplaced, RuntimeSandboxUpserted
from koordqos.localsources import pod_from_sandbox
from koordqos.metrics.hardware import read_hardware
from koordqos.metrics.topology import read_topology
from koordqos.report.kubelet import KubeletCPUManager
from koordqos.report.topologyreporter import KubeletSources, TopologyReporter
from koordqos.state import NodeState, reduce
from koordqos.testing.nodefs import SyntheticNode

PINNED = RuntimeSandbox(
    "sb-db",
    "db-uid",
    "db",
    "default",
    {"koordinator.sh/qosClass": "LSR"},
    {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0-1"})},
    "/kubepods/poddb-uid",
)


def reporter(tmp_path: Path) -> TopologyReporter:
    node = SyntheticNode(tmp_path / "node", cpus=4)
    return TopologyReporter(
        EventBus(),
        "node",
        read_topology(node.sys_root),
        read_hardware(node.proc_root, node.sys_root),
        None,
        kubelet=KubeletSources(
            explicit=KubeletCPUManager(policy="none", source="config"), kubelet_root=tmp_path
        ),
    )


async def test_a_pinned_sandbox_leaves_the_share_pool_before_its_pod_is_known(tmp_path: Path) -> None:
    r = reporter(tmp_path)
    state = reduce(NodeState(), RuntimeSandboxUpserted(PINNED))
    assert r.desired_for(state) is None  # before the first round asked the kubelet: nothing to give
    first = await r.compute(NodeState())
    assert first is not None
    assert [p.cpuset for p in first.pools.ls] == ["0-3"]
    want = r.desired_for(state)
    assert want is not None
    assert [p.cpuset for p in want.pools.ls] == ["2-3"]  # was 0-3: the sandbox was not counted
    assert r.desired_for(state) is want  # the same state: the memoised result (the hooks skip parsing it)
    # once its pod is known it counts once, and the pools are the same
    with_pod = reduce(state, PodsReplaced((pod_from_sandbox(PINNED, "node"),), source="nri"))
    assert len(r.node_pods(with_pod)) == 1
    again = r.desired_for(with_pod)
    assert again is not None
    assert again.pools == want.pools
