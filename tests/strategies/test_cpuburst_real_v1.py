"""CPU burst on this machine's real cgroup v1 hierarchy, inside a uniquely named scratch cgroup.

The pod's dirs are `<scratch>/kubepods/burstable/pod<uid>/<container id>` (a layout whose QoS dirs live
under the scratch dir), so the strategy's real writes never touch anything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from koordqos.cgroups.executor import CgroupExecutor, Outcome
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.decisions import DecisionLog
from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.strategies.cpuburst import CPUBurstStrategy
from koordqos.strategies.framework import StrategyEnv
from koordqos.testing.scratchcg import REAL_ROOT, Scratch, unavailable_reason
from koordqos.testing.strategyenv import strategy_env

from .cpuburst_builders import NOW, ctr, make_pod, make_slo, make_state, topology

pytestmark = pytest.mark.cgroupv1


class ScratchLayout(CgroupLayout):
    """The real v1 hierarchy with the kubepods tree moved under a scratch dir."""

    def __init__(self, prefix: str) -> None:
        super().__init__(REAL_ROOT, CgroupVersion.V1, CgroupDriver.CGROUPFS)
        self.prefix = prefix

    def kubepods_dir(self) -> str:
        return f"{self.prefix}/kubepods"

    def qos_dir(self, kube_qos: KubeQoS) -> str:
        return f"{self.prefix}/{super().qos_dir(kube_qos)}"


@dataclass
class Real:
    scratch: Scratch
    env: StrategyEnv
    store: MetricStore
    decisions: DecisionLog
    strategy: CPUBurstStrategy
    pod: PodInfo
    pod_dir: str
    clock: list[float]

    @property
    def ctr_dir(self) -> str:
        return f"{self.pod_dir}/c1"

    def read(self, rel: str, name: str) -> int:
        return int(self.scratch.read(rel, "cpu", name))

    def set_quota(self, rel: str, quota: int) -> None:
        self.scratch.path(rel, "cpu", "cpu.cfs_quota_us").write_text(f"{quota}\n")

    async def run(self, node_cpu: float, **slo: Any) -> None:
        """One round 6 s after the previous one (past the 5 s window: only this node sample counts)."""
        self.clock[0] += 6
        self.store.add(MetricKind.NODE_CPU_USAGE, "", node_cpu, self.clock[0])
        self.store.add(MetricKind.CONTAINER_CPU_THROTTLED, "containerd://c1", 0.5, self.clock[0])
        await self.strategy.run_once(make_state([self.pod], make_slo(**slo)), self.env)


@pytest.fixture
def real() -> Iterator[Real]:
    reason = unavailable_reason()
    if reason:
        print(f"skipping real cgroup v1 test: {reason}")
        pytest.skip(reason)
    if not (REAL_ROOT / "cpu" / "cpu.cfs_burst_us").exists():
        print("skipping real cgroup v1 test: this kernel has no cpu.cfs_burst_us")
        pytest.skip("this kernel has no cpu.cfs_burst_us")
    scratch = Scratch()
    try:
        for rel in ("", "kubepods", "kubepods/burstable"):
            scratch.mkcg(rel)
        pod = make_pod("burst-real", [ctr("main", "c1", cpu_limit=1000)], qos="LS")
        layout = ScratchLayout(scratch.name)
        pod_dir = layout.pod_dir(pod)
        scratch.mkcg(pod_dir.removeprefix(f"{scratch.name}/"))
        scratch.mkcg(f"{pod_dir.removeprefix(f'{scratch.name}/')}/c1")
    except OSError as exc:
        scratch.cleanup()
        print(f"skipping real cgroup v1 test: cannot create scratch cgroup: {exc}")
        pytest.skip(f"cannot create scratch cgroup: {exc}")
    clock = [NOW]
    store = MetricStore(600, 1.0, clock=lambda: clock[0])
    decisions = DecisionLog()
    env = strategy_env(
        layout,
        decisions,
        executor=CgroupExecutor(layout, decisions),
        store=store,
        topology=topology(16),
        clock=lambda: clock[0],
    )
    try:
        yield Real(scratch, env, store, decisions, CPUBurstStrategy(rand=lambda: 0.0), pod, pod_dir, clock)
    finally:
        scratch.cleanup()
        assert not (REAL_ROOT / "cpu" / scratch.name).exists()


async def test_static_burst_lands_in_real_cgroup(real: Real) -> None:
    """Unlimited quota (the kernel requires burst ≤ quota otherwise): 1 core × 1000 % → 1,000,000 µs."""
    await real.run(1.0, policy="cpuBurstOnly", cpuBurstPercent=1000)
    assert real.read(real.ctr_dir, "cpu.cfs_burst_us") == 1_000_000
    assert real.read(real.pod_dir, "cpu.cfs_burst_us") == 1_000_000
    # policy none takes it back
    await real.run(1.0, policy="none")
    assert real.read(real.ctr_dir, "cpu.cfs_burst_us") == 0
    assert real.read(real.pod_dir, "cpu.cfs_burst_us") == 0


async def test_kernel_rejects_burst_above_quota_so_bursts_are_capped_at_the_quota(real: Real) -> None:
    """Upstream kernels refuse burst > quota (EINVAL). Project decision: the refusal is recorded once; from
    then on every burst is capped at the container's base quota, retried in the same round."""
    for rel in (real.pod_dir, real.ctr_dir):
        real.set_quota(rel, 100_000)
    await real.run(1.0, policy="cpuBurstOnly", cpuBurstPercent=1000)
    assert real.strategy.last is not None
    outcomes = [r.outcome for r in real.strategy.last.results]
    assert outcomes == [Outcome.FAILED, Outcome.FAILED, Outcome.WRITTEN, Outcome.WRITTEN]
    assert "Invalid argument" in real.strategy.last.results[0].error
    failed = [d for d in real.decisions.recent(strategy="CPUBurst") if d.action == "write-failed"]
    assert len(failed) == 2
    assert real.read(real.ctr_dir, "cpu.cfs_burst_us") == 100_000
    assert real.read(real.pod_dir, "cpu.cfs_burst_us") == 100_000
    # later rounds go straight to the capped value: no further refused writes
    await real.run(1.0, policy="cpuBurstOnly", cpuBurstPercent=1000)
    failed = [d for d in real.decisions.recent(strategy="CPUBurst") if d.action == "write-failed"]
    assert len(failed) == 2
    assert all(r.ok for r in real.strategy.last.results)
    # and the quota can still be lowered to its base while the burst stays valid
    await real.run(1.0, policy="cpuBurstOnly", cpuBurstPercent=50)
    assert real.read(real.ctr_dir, "cpu.cfs_burst_us") == 50_000


async def test_quota_write_order_accepted_by_kernel(real: Real) -> None:
    """v1 refuses a child quota above its parent's: scale-up writes the pod first, scale-down the child."""
    for rel in (real.pod_dir, real.ctr_dir):
        real.set_quota(rel, 100_000)
    await real.run(1.0, policy="cfsQuotaBurstOnly")  # idle, throttled → ×1.2
    assert real.strategy.last is not None
    assert all(
        r.outcome is Outcome.WRITTEN for r in real.strategy.last.results if "quota" in r.write.resource
    )
    assert real.read(real.pod_dir, "cpu.cfs_quota_us") == 120_000
    assert real.read(real.ctr_dir, "cpu.cfs_quota_us") == 120_000
    await real.run(15.0, policy="cfsQuotaBurstOnly")  # 15 of 16 cores busy: overload → ×0.8, floor at base
    assert real.read(real.ctr_dir, "cpu.cfs_quota_us") == 100_000
    assert real.read(real.pod_dir, "cpu.cfs_quota_us") == 100_000
