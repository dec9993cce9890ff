"""Builders for the CPU burst tests: pods, NodeSLOs, metric stores, a strategy harness on a synthetic node
(the `harness` fixture itself is in conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from koordqos.cgroups.executor import CgroupExecutor
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import AgentConfig
from koordqos.decisions import DecisionLog
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import CpuInfo, CpuTopology
from koordqos.metrics.types import MetricKind
from koordqos.model.nodeslo import NodeSLO, parse_nodeslo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState
from koordqos.strategies.cpuburst import CPUBurstStrategy
from koordqos.strategies.framework import StrategyEnv
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.strategyenv import strategy_env

NOW = 1000.0
LABEL_QOS = "koordinator.sh/qosClass"


def ctr(
    name: str, cid: str | None, cpu_limit: int = 0, cpu_request: int = 0, state: str = "running"
) -> ContainerInfo:
    """A started container (`containerd://<cid>`) with cpu limit/request in milli-cores."""
    limits = {"cpu": cpu_limit} if cpu_limit else {}
    requests = {"cpu": cpu_request} if cpu_request else {}
    return ContainerInfo(
        name=name,
        container_id=f"containerd://{cid}" if cid else "",
        limits=limits,
        requests=requests,
        state=state,
    )


def make_pod(
    uid: str,
    containers: Sequence[ContainerInfo],
    qos: str | None = "LS",
    kube_qos: KubeQoS = KubeQoS.BURSTABLE,
    burst: Mapping[str, Any] | str | None = None,
    phase: str = "Running",
    namespace: str = "default",
) -> PodInfo:
    """A pod with a Koordinator QoS label and an optional `koordinator.sh/cpuBurst` annotation."""
    labels = {LABEL_QOS: qos} if qos else {}
    annotations: dict[str, str] = {}
    if burst is not None:
        annotations["koordinator.sh/cpuBurst"] = burst if isinstance(burst, str) else json.dumps(burst)
    return PodInfo(
        uid=uid,
        namespace=namespace,
        name=uid,
        labels=labels,
        annotations=annotations,
        phase=phase,
        kube_qos=kube_qos,
        containers=tuple(containers),
    )


def make_slo(**cpu_burst: Any) -> NodeSLO:
    """A merged NodeSLO whose cpuBurstStrategy has `cpu_burst` (camelCase keys) over the defaults."""
    return parse_nodeslo({"spec": {"cpuBurstStrategy": cpu_burst}})


def topology(cpus: int) -> CpuTopology:
    """`cpus` logical CPUs, two per core."""
    return CpuTopology(tuple(CpuInfo(i, i // 2, 0, 0) for i in range(cpus)))


def make_state(pods: Sequence[PodInfo], slo: NodeSLO | None) -> NodeState:
    """A NodeState holding `pods` and `slo`."""
    return NodeState(pods=MappingProxyType({p.uid: p for p in pods}), node_slo=slo)


@dataclass
class Harness:
    """The strategy on a synthetic node with a metric store at a fixed time."""

    node: SyntheticNode
    strategy: CPUBurstStrategy
    env: StrategyEnv
    store: MetricStore
    decisions: DecisionLog
    executor: CgroupExecutor
    now: list[float] = field(default_factory=lambda: [NOW])

    def metrics(
        self,
        node_cpu: float | None = None,
        pod_cpu: Mapping[str, float] | None = None,
        container_cpu: Mapping[str, float] | None = None,
        throttled: Mapping[str, float] | None = None,
    ) -> None:
        """Add one sample per given series at the current time (container keys are bare ids)."""
        t = self.now[0]
        if node_cpu is not None:
            self.store.add(MetricKind.NODE_CPU_USAGE, "", node_cpu, t)
        for uid, v in (pod_cpu or {}).items():
            self.store.add(MetricKind.POD_CPU_USAGE, uid, v, t)
        for cid, v in (container_cpu or {}).items():
            self.store.add(MetricKind.CONTAINER_CPU_USAGE, f"containerd://{cid}", v, t)
        for cid, v in (throttled or {}).items():
            self.store.add(MetricKind.CONTAINER_CPU_THROTTLED, f"containerd://{cid}", v, t)

    def add_pod(
        self, pod: PodInfo, pod_quota: int | None = None, quotas: Mapping[str, int] | None = None
    ) -> str:
        """Create the pod's cgroups; set the pod quota and container quotas (by bare id)."""
        pod_dir = self.node.add_pod(pod)
        if pod_quota is not None:
            self.write_quota(pod_dir, pod_quota)
        for cid, q in (quotas or {}).items():
            self.write_quota(f"{pod_dir}/{cid}", q)
        return pod_dir

    def write_quota(self, rel: str, quota: int) -> None:
        """Set a cgroup's quota the way the kernel shows it."""
        if self.node.version is CgroupVersion.V1:
            self.node.write(rel, "cpu", "cpu.cfs_quota_us", quota)
        else:
            self.node.write(rel, "cpu", "cpu.max", f"{'max' if quota < 0 else quota} 100000")

    def quota(self, rel: str) -> int:
        """A cgroup's current quota (-1 unlimited)."""
        if self.node.version is CgroupVersion.V1:
            return int(self.node.read(rel, "cpu", "cpu.cfs_quota_us"))
        q = self.node.read(rel, "cpu", "cpu.max").split()[0]
        return -1 if q == "max" else int(q)

    def burst(self, rel: str) -> int:
        """A cgroup's CFS burst (µs)."""
        name = "cpu.cfs_burst_us" if self.node.version is CgroupVersion.V1 else "cpu.max.burst"
        return int(self.node.read(rel, "cpu", name))

    async def run(self, pods: Sequence[PodInfo], slo: NodeSLO | None) -> None:
        """One strategy round over `pods` with `slo`."""
        await self.strategy.run_once(make_state(pods, slo), self.env)


def build_harness(
    base: Path,
    cpus: int = 16,
    version: CgroupVersion = CgroupVersion.V1,
    burst_file: bool = True,
    dry_run: bool = False,
    config: AgentConfig | None = None,
) -> Harness:
    """A harness on a fresh synthetic node (v1 with the burst file unless told otherwise)."""
    node = SyntheticNode(
        base,
        version,
        CgroupDriver.CGROUPFS,
        cpus=cpus,
        extensions=("cpu.cfs_burst_us",) if burst_file and version is CgroupVersion.V1 else (),
    )
    if not burst_file and version is CgroupVersion.V2:
        for f in node.cgroup_root.rglob("cpu.max.burst"):
            f.unlink()
    now = [NOW]
    store = MetricStore(600, 1.0, clock=lambda: now[0])
    decisions = DecisionLog(dry_run=dry_run)
    executor = CgroupExecutor(node.layout, decisions, clock=lambda: now[0])
    env = strategy_env(
        node.layout,
        decisions,
        config=config or AgentConfig(),
        executor=executor,
        store=store,
        topology=topology(cpus),
        clock=lambda: now[0],
    )
    strategy = CPUBurstStrategy(rand=lambda: 0.0)
    return Harness(node, strategy, env, store, decisions, executor, now)
