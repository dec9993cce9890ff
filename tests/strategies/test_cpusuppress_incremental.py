"""CPU suppress plans no write when its inputs did not change; it walks the BE dirs again only when the BE
pods changed, a dir vanished, or in the full round, which also puts back a file changed behind our back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from koordqos.cgroups.executor import CgroupExecutor
from koordqos.config import build_config
from koordqos.decisions import DecisionLog
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricKind
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState
from koordqos.strategies.cpusuppress import FULL_PASS_SECONDS, CPUSuppressStrategy
from koordqos.strategies.framework import StrategyEnv
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.strategyenv import strategy_env

CPUS = 8


def _pod(i: int, be: bool) -> PodInfo:
    return PodInfo(
        uid=f"uid-{i}",
        namespace="ns",
        name=f"p{i}",
        labels={"koordinator.sh/qosClass": "BE" if be else "LS"},
        kube_qos=KubeQoS.BESTEFFORT if be else KubeQoS.BURSTABLE,
        containers=(ContainerInfo(name="main", container_id=f"containerd://{i:064x}", state="running"),),
    )


@dataclass
class Node:
    fs: SyntheticNode
    env: StrategyEnv
    strategy: CPUSuppressStrategy
    now: list[float]
    pods: dict[str, PodInfo]
    policy: str

    def state(self) -> NodeState:
        slo = parse_nodeslo(
            {"spec": {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": self.policy}}}
        )
        node = NodeInfo(name="n", capacity={"cpu": CPUS * 1000}, allocatable={"cpu": CPUS * 1000})
        return NodeState(pods=MappingProxyType(dict(self.pods)), node=node, node_slo=slo)

    def add(self, pod: PodInfo) -> str:
        self.pods[pod.uid] = pod
        return self.fs.add_pod(pod)

    async def round(self, state: NodeState) -> int:
        """One round 1 s later on `state`; the writes it handed to the executor."""
        self.now[0] += 1
        store = self.env.store
        store.add(MetricKind.NODE_CPU_USAGE, "", 2.0, self.now[0])
        for uid in self.pods:
            store.add(MetricKind.POD_CPU_USAGE, uid, 0.1, self.now[0])
        await self.strategy.run_once(state, self.env)
        assert self.strategy.last_plan is not None
        return len(self.strategy.last_plan.writes)


def build(tmp_path: Path, policy: str, n: int = 6) -> Node:
    fs = SyntheticNode(tmp_path, cpus=CPUS)
    now = [1000.0]
    decisions = DecisionLog()
    env = strategy_env(
        fs.layout,
        decisions,
        config=build_config({}),
        executor=CgroupExecutor(fs.layout, decisions, clock=lambda: now[0]),
        store=MetricStore(600, 1.0, clock=lambda: now[0]),
        topology=read_topology(fs.sys_root),
        clock=lambda: now[0],
    )
    node = Node(fs, env, CPUSuppressStrategy(), now, {}, policy)
    for i in range(n):
        node.add(_pod(i, be=i % 2 == 0))
    return node


async def test_cfs_quota_policy_plans_no_cpuset_recovery_when_nothing_changed(tmp_path: Path) -> None:
    node = build(tmp_path, "cfsQuota")
    state = node.state()
    assert await node.round(state) > 0  # the first (full) round recovers every BE dir's cpuset
    writes, reads = node.env.executor.file_writes, node.env.executor.file_reads
    for _ in range(3):
        assert await node.round(state) <= 1  # the BE quota may move; no cpuset write is planned
        assert all(w.resource == "cpu.cfs_quota_us" for w in node.strategy.last_plan.writes)  # type: ignore[union-attr]
    assert node.strategy.walks == 1
    cpuset_reads = node.env.executor.file_reads - reads
    assert cpuset_reads <= 3  # only quota writes read their file
    assert node.env.executor.file_writes - writes <= 3


async def test_cpuset_policy_plans_no_write_once_settled(tmp_path: Path) -> None:
    node = build(tmp_path, "cpuset")
    state = node.state()
    await node.round(state)  # suppresses: loosen, then exact cpusets
    await node.round(state)  # the BE cpuset read back equals the picked one: same writes, all unchanged
    for _ in range(3):
        assert await node.round(state) == 0
    assert node.strategy.walks == 1


async def test_a_cpuset_changed_behind_our_back_is_put_back_by_the_full_round(tmp_path: Path) -> None:
    node = build(tmp_path, "cfsQuota")
    state = node.state()
    await node.round(state)
    pod_dir = node.fs.layout.pod_dir(node.pods["uid-0"])
    full = node.fs.read(pod_dir, "cpuset", "cpuset.cpus")
    node.fs.write(pod_dir, "cpuset", "cpuset.cpus", "0-1")
    await node.round(state)
    assert node.fs.read(pod_dir, "cpuset", "cpuset.cpus") == "0-1"  # not looked at between full rounds
    node.now[0] += FULL_PASS_SECONDS
    await node.round(state)
    assert node.fs.read(pod_dir, "cpuset", "cpuset.cpus") == full
    assert node.strategy.walks == 2


async def test_a_new_be_pod_is_walked_and_recovered_next_round(tmp_path: Path) -> None:
    node = build(tmp_path, "cfsQuota")
    await node.round(node.state())
    await node.round(node.state())  # LS-only changes (a new mapping, same BE pods): no walk
    assert node.strategy.walks == 1
    pod_dir = node.add(_pod(100, be=True))
    node.fs.write(pod_dir, "cpuset", "cpuset.cpus", "0")
    assert await node.round(node.state()) > 0
    assert node.strategy.walks == 2
    assert node.fs.read(pod_dir, "cpuset", "cpuset.cpus") == f"0-{CPUS - 1}"
    node.add(_pod(101, be=False))
    await node.round(node.state())
    assert node.strategy.walks == 2


async def test_a_vanished_dir_makes_the_next_round_walk_again(tmp_path: Path) -> None:
    node = build(tmp_path, "cpuset")
    state = node.state()
    await node.round(state)
    await node.round(state)
    # a BE pod's dirs go away behind our back while the pod is still known; the BE cpuset moves, so the
    # next plan writes every walked dir and meets the vanished ones
    pod_dir = node.fs.layout.pod_dir(node.pods["uid-2"])
    for sub in node.fs.hierarchies:
        d = node.fs.cgroup_root / sub / pod_dir
        for child in sorted(d.rglob("*"), key=lambda p: -len(p.parts)):
            child.rmdir() if child.is_dir() else child.unlink()
        d.rmdir()
    be_dir = node.fs.layout.qos_dir(KubeQoS.BESTEFFORT)
    node.fs.write(be_dir, "cpuset", "cpuset.cpus", f"0-{CPUS - 1}")
    await node.round(state)
    assert node.strategy.walks == 1
    await node.round(state)
    assert node.strategy.walks == 2
    assert not any(pod_dir in d.path for d in node.strategy._be_dirs)
