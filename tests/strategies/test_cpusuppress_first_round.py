"""CPU suppress's first round, and the round a BE pod starts, write koordlet's value (issue #32, item 5c).

A pod's CPU is a rate: its first sample comes one collect round after the node's usage already holds its CPU.
Planned from that round, a BE pod's CPU counted as system usage and the quota went to the 2000 µs floor,
then climbed 10 % of the node per round (about 4 s on 4 CPUs): every rollout starved BE. Now the round
waits (at most `--cpu-suppress-new-pod-wait-rounds` collect intervals) for the pod's first sample.

Scenario of the issue: 4 CPUs, threshold 65 %, LS 1.2 cores, BE 2.0 → 4 × 0.65 − 1.2 = 1.4 cores (140000 µs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import pytest

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
from koordqos.observability import REGISTRY
from koordqos.state import NodeState
from koordqos.strategies.cpusuppress import BE_SUPPRESS_CORES, CPUSuppressStrategy
from koordqos.strategies.framework import StrategyEnv
from koordqos.testing.nodefs import GiB, SyntheticNode
from koordqos.testing.strategyenv import strategy_env
from tests.strategies.test_agent_integration import (
    NODE,
    CounterDriver,
    FakeAPIServer,
    Rates,
    make_node,
    make_nodeslo,
    make_pod,
    parse_pod,
    running_agent,
    wait_until,
)

CPUS = 4
BE_DIR = "kubepods/besteffort"


@pytest.fixture
async def server() -> AsyncIterator[FakeAPIServer]:
    srv = FakeAPIServer()
    await srv.start()
    yield srv
    await srv.stop()


def _pod(name: str, be: bool, state: str = "running") -> PodInfo:
    return PodInfo(
        uid=f"uid-{name}",
        namespace="ns",
        name=name,
        labels={"koordinator.sh/qosClass": "BE" if be else "LS"},
        kube_qos=KubeQoS.BESTEFFORT if be else KubeQoS.BURSTABLE,
        containers=(ContainerInfo(name="main", container_id=f"containerd://{name:0>64}", state=state),),
    )


@dataclass
class Node:
    fs: SyntheticNode
    env: StrategyEnv
    strategy: CPUSuppressStrategy
    now: list[float]
    pods: dict[str, PodInfo] = field(default_factory=dict)

    def state(self) -> NodeState:
        slo = parse_nodeslo(
            {
                "spec": {
                    "resourceUsedThresholdWithBE": {
                        "enable": True,
                        "cpuSuppressPolicy": "cfsQuota",
                        "cpuSuppressThresholdPercent": 65,
                    }
                }
            }
        )
        node = NodeInfo(name="n", capacity={"cpu": CPUS * 1000}, allocatable={"cpu": CPUS * 1000})
        return NodeState(pods=MappingProxyType(dict(self.pods)), node=node, node_slo=slo)

    def add(self, pod: PodInfo) -> None:
        self.pods[pod.uid] = pod
        self.fs.add_pod(pod)

    async def round(self, node_used: float, pod_used: dict[str, float]) -> list[int]:
        """One collect round 1 s later (the node's usage and the pods that have a sample), then one CPU
        suppress round; the quotas it wrote."""
        self.now[0] += 1
        store = self.env.store
        store.add(MetricKind.NODE_CPU_USAGE, "", node_used, self.now[0])
        for uid, used in pod_used.items():
            store.add(MetricKind.POD_CPU_USAGE, uid, used, self.now[0])
        before = len(self.env.decisions)
        await self.strategy.run_once(self.state(), self.env)
        return [
            int(str(d.new))
            for d in self.env.decisions.recent()[before:]
            if d.target == f"{BE_DIR}/cpu.cfs_quota_us" and d.action == "write"
        ]

    def quota(self) -> int:
        return int(self.fs.read(BE_DIR, "cpu", "cpu.cfs_quota_us"))


def build(tmp_path: Path, dry_run: bool = False, **qos: object) -> Node:
    fs = SyntheticNode(tmp_path, cpus=CPUS)
    now = [1000.0]
    decisions = DecisionLog(dry_run=dry_run)
    env = strategy_env(
        fs.layout,
        decisions,
        config=build_config({"qos": qos}),
        executor=CgroupExecutor(fs.layout, decisions, clock=lambda: now[0]),
        store=MetricStore(600, 1.0, clock=lambda: now[0]),
        topology=read_topology(fs.sys_root),
        clock=lambda: now[0],
    )
    return Node(fs, env, CPUSuppressStrategy(), now)


async def test_the_first_round_waits_for_the_be_pods_first_sample_and_writes_koordlets_value(
    tmp_path: Path,
) -> None:
    node = build(tmp_path)
    node.add(_pod("ls", be=False))
    node.add(_pod("be", be=True))
    # the collector's first reading of the pods: the node's usage holds their 3.2 cores, no pod has a rate
    assert await node.round(3.2, {}) == []
    assert node.quota() == -1
    plan = node.strategy.last_plan
    assert plan is not None
    assert plan.skipped.startswith("waiting for the first CPU sample of 1 BE pods")
    # the next round has every sample: 2.6 − 1.2 − 0 (system) = 1.4 cores, written from -1 in one step
    assert await node.round(3.2, {"uid-ls": 1.2, "uid-be": 2.0}) == [140_000]
    assert node.quota() == 140_000
    assert await node.round(3.2, {"uid-ls": 1.2, "uid-be": 2.0}) == []  # and stays


async def test_a_be_pod_starting_does_not_cut_be_while_its_first_sample_is_to_come(tmp_path: Path) -> None:
    node = build(tmp_path)
    node.add(_pod("ls", be=False))
    node.add(_pod("be", be=True))
    assert await node.round(2.6, {"uid-ls": 1.2, "uid-be": 1.4}) == [140_000]
    # a second BE pod starts and takes 0.4 of BE's 1.4 cores; its first collect round has no rate
    node.add(_pod("be2", be=True))
    assert await node.round(2.6, {"uid-ls": 1.2, "uid-be": 1.0}) == []  # no cut to 2.6 − 1.2 − 0.4 = 1.0
    assert await node.round(2.6, {"uid-ls": 1.2, "uid-be": 1.0, "uid-be2": 0.4}) == []
    assert node.quota() == 140_000


async def test_a_pod_that_is_not_running_or_not_be_is_not_waited_for(tmp_path: Path) -> None:
    node = build(tmp_path)
    node.add(_pod("ls", be=False))  # an LS pod's CPU is subtracted whether as its own or as system usage
    node.add(_pod("pending", be=True, state="waiting"))
    assert await node.round(1.2, {}) == [140_000]


async def test_a_be_pod_never_measured_holds_suppress_for_the_wait_only(tmp_path: Path) -> None:
    node = build(tmp_path)  # 3 collect intervals of 1 s
    node.add(_pod("ls", be=False))
    node.add(_pod("be", be=True))
    for _ in range(3):  # seen at t+1; waited at t+1, t+2, t+3 (less than 3 s after)
        assert await node.round(1.2, {"uid-ls": 1.2}) == []
    assert await node.round(1.2, {"uid-ls": 1.2}) == [140_000]  # then its CPU is system usage, as before
    # a container restart is a new start: waited for again (a cut of 0.4 would be written otherwise)
    restarted = _pod("be", be=True).model_copy(
        update={
            "containers": (
                ContainerInfo(name="main", container_id="containerd://" + "e" * 64, state="running"),
            )
        }
    )
    node.pods[restarted.uid] = restarted
    assert await node.round(1.6, {"uid-ls": 1.2}) == []


async def test_zero_wait_rounds_is_koordlets_split_the_first_round_goes_to_the_floor(tmp_path: Path) -> None:
    node = build(tmp_path, cpu_suppress_new_pod_wait_rounds=0)
    node.add(_pod("ls", be=False))
    node.add(_pod("be", be=True))
    assert await node.round(3.2, {}) == [2000]  # 2.6 − 3.2 (all system) < 0 → the floor
    assert await node.round(3.2, {"uid-ls": 1.2, "uid-be": 2.0}) == [42_000]  # + 10 % of 4 CPUs


async def test_the_agents_first_quota_is_koordlets_value(tmp_path: Path, server: FakeAPIServer) -> None:
    """The agent in-process, the collector measuring the synthetic node's counters: the first besteffort
    quota it writes is 1.4 cores (was -1 → 2000, then 42000, 82000, 122000, 140000)."""
    node = SyntheticNode(tmp_path / "node", cpus=CPUS, memory_total=64 * GiB)
    ls = make_pod("ls", NODE, qos="LS", uid="uid-ls", requests={"cpu": "1"}, limits={"cpu": "2"})
    be = make_pod("be", NODE, qos="BE", uid="uid-be")
    ls_dir, be_dir = node.add_pod(parse_pod(ls)), node.add_pod(parse_pod(be))
    server.upsert("nodes", make_node(NODE, cpu=str(CPUS), memory="64Gi"))
    server.upsert("pods", ls)
    server.upsert("pods", be)
    slo = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressPolicy": "cfsQuota",
            "cpuSuppressThresholdPercent": 65,
        }
    }
    server.upsert("nodeslos", make_nodeslo(NODE, slo))
    async with running_agent(
        tmp_path, server, CounterDriver(node, Rates({ls_dir: 1.2, be_dir: 2.0}))
    ) as agent:

        def quota_writes() -> list[int]:
            return [
                int(str(d.new))
                for d in agent.decisions.recent(strategy="BECPUSuppress")
                if d.target == f"{BE_DIR}/cpu.cfs_quota_us" and d.action == "write"
            ]

        await wait_until(quota_writes, timeout=10, message="the first quota")
        first = quota_writes()[0]
    assert abs(first - 140_000) <= 10_000, quota_writes()


def _cores_exported() -> float | None:
    return REGISTRY.get_sample_value("koordqos_be_suppress_cores", {"policy": "cfsQuota"})


async def test_a_restart_over_a_suppressed_node_exports_the_cap_in_force(tmp_path: Path) -> None:
    """issue #32 item 5g: the besteffort quota is already what the formula gives (the agent's last run
    wrote it): the round writes nothing, and koordqos_be_suppress_cores still says 1.4."""
    node = build(tmp_path)
    node.fs.write(BE_DIR, "cpu", "cpu.cfs_quota_us", 140_000)
    node.add(_pod("ls", be=False))
    node.add(_pod("be", be=True))
    BE_SUPPRESS_CORES.clear()  # a new process has no sample yet
    for _ in range(3):
        assert await node.round(2.6, {"uid-ls": 1.2, "uid-be": 1.4}) == []
        assert _cores_exported() == 1.4
    assert node.quota() == 140_000
