"""Per-round cost of the CPUBurst strategy at 200 LS pods (one 2-core container each), policy `auto`.

Synthetic cgroup v1 node (32 CPUs, cpu.cfs_burst_us present) in a temp dir, a metric store with node,
pod and container samples, and the real cgroup executor. Three cases:
* steady: quotas at their ceiling, static burst already written (cached) — the usual round;
* active: the node flips between idle and overloaded every round, so every container's quota moves
  (×1.2 / ×0.8: a read of container and pod quota and two writes per container, plus the burst writes);
* dry-run: the active case with the executor in dry-run (decisions recorded, nothing written);
* policy none: the node's policy is `none` (200 and 1,000 pods): a round should visit no pod;
* 1,000 pods, 100 with auto: node policy `none`, every 10th pod annotated `auto` (steady): the cost should
  follow the 100, not the 1,000.
The node lives on tmpfs (/dev/shm) by default: closer to cgroupfs than a disk-backed /tmp.

    python bench/cpuburst.py [--quick] [--runs N] [--pods N]
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

import structlog

from _common import LongestStep, machine, median, parser, table
from koordqos.cgroups import CgroupExecutor
from koordqos.decisions import DecisionLog
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricKind
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState
from koordqos.strategies.cpuburst import CPUBurstStrategy
from koordqos.testing.nodefs import GiB, SyntheticNode
from koordqos.testing.strategyenv import strategy_env

CPUS = 32
ANNOTATION = "koordinator.sh/cpuBurst"
DEFAULT_DIR = "/dev/shm" if Path("/dev/shm").is_dir() else None


class Bench:
    """A node with `n` LS pods and the strategy wired to a store whose clock the bench advances."""

    def __init__(
        self, base: Path, n: int, dry_run: bool, node_policy: str = "auto", burst_every: int = 0
    ) -> None:
        self.fs = SyntheticNode(base, cpus=CPUS, memory_total=256 * GiB, extensions=("cpu.cfs_burst_us",))
        self.now = 1000.0
        self.store = MetricStore(600, 1.0, clock=lambda: self.now)
        pods: dict[str, PodInfo] = {}
        self.cids: list[str] = []
        for i in range(n):
            cid = f"containerd://{i:064x}"
            # burst_every k: every k-th pod carries its own `auto` policy over the node's (the mixed case)
            annotations = {ANNOTATION: '{"policy": "auto"}'} if burst_every and i % burst_every == 0 else {}
            pod = PodInfo(
                uid=f"uid-{i:04d}",
                namespace="bench",
                name=f"pod-{i}",
                labels={"koordinator.sh/qosClass": "LS"},
                annotations=annotations,
                kube_qos=KubeQoS.BURSTABLE,
                containers=(
                    ContainerInfo(
                        name="main",
                        container_id=cid,
                        requests={"cpu": 1000},
                        limits={"cpu": 2000},
                        state="running",
                    ),
                ),
            )
            pod_dir = self.fs.add_pod(pod)
            for rel in (pod_dir, f"{pod_dir}/{i:064x}"):
                self.fs.write(rel, "cpu", "cpu.cfs_quota_us", 200_000)
            pods[pod.uid] = pod
            self.cids.append(cid)
        slo = parse_nodeslo({"spec": {"cpuBurstStrategy": {"policy": node_policy}}})
        self.state = NodeState(pods=MappingProxyType(pods), node_slo=slo)
        decisions = DecisionLog(size=256, dry_run=dry_run)
        self.env = strategy_env(
            self.fs.layout,
            decisions,
            store=self.store,
            executor=CgroupExecutor(self.fs.layout, decisions, clock=lambda: self.now),
            topology=read_topology(self.fs.sys_root),
            clock=lambda: self.now,
        )
        self.strategy = CPUBurstStrategy()

    def samples(self, node_cpu: float, throttled: float) -> None:
        """One collection's worth of samples, 6 s after the previous (past the 5 s node window)."""
        self.now += 6
        self.store.add(MetricKind.NODE_CPU_USAGE, "", node_cpu, self.now)
        for i, cid in enumerate(self.cids):
            self.store.add(MetricKind.POD_CPU_USAGE, f"uid-{i:04d}", 1.5, self.now)
            self.store.add(MetricKind.CONTAINER_CPU_USAGE, cid, 1.5, self.now)
            self.store.add(MetricKind.CONTAINER_CPU_THROTTLED, cid, throttled, self.now)

    async def round(self) -> tuple[float, float]:
        """(wall ms, CPU ms) of one round."""
        w0, c0 = time.perf_counter(), time.process_time()
        await self.strategy.run_once(self.state, self.env)
        return (time.perf_counter() - w0) * 1000, (time.process_time() - c0) * 1000


@dataclass(frozen=True)
class Case:
    """A benchmark case: pods, the node's policy, every k-th pod with its own `auto` annotation."""

    name: str
    pods: int
    node_policy: str = "auto"
    burst_every: int = 0
    dry_run: bool = False
    moving: bool = False  # quotas move every round (else: steady at the ceiling)


CASES = (
    Case("steady", 200),
    Case("active", 200, moving=True),
    Case("dry-run", 200, dry_run=True, moving=True),
    Case("policy none", 200, node_policy="none"),
    Case("policy none, 1,000 pods", 1000, node_policy="none"),
    Case("1,000 pods, 100 with auto", 1000, node_policy="none", burst_every=10),
)


async def measure(base: Path, case: Case, rounds: int) -> tuple[float, float, float, float]:
    """Median (wall ms, CPU ms, containers decided per round, longest loop step's loop-thread CPU ms)."""
    b = Bench(base, case.pods, case.dry_run, case.node_policy, case.burst_every)
    if not case.moving:
        for _ in range(8):  # grow to the ceiling, then stay there
            b.samples(1.0, 0.5)
            await b.round()
    gc.collect()
    gc.freeze()
    walls, cpus, decided = [], [], []
    worst = 0.0
    with LongestStep() as probe:
        for r in range(rounds):
            if not case.moving:
                b.samples(1.0, 0.0)
            else:  # idle+throttled (×1.2) and overloaded (×0.8) in turn: every quota moves every round
                b.samples(1.0 if r % 2 == 0 else CPUS * 0.9, 0.5)
            await asyncio.sleep(0)  # the probe sees the fixture's samples as their own step ...
            probe.reset()  # ... which is not the strategy's
            wall, cpu = await b.round()
            await asyncio.sleep(0)  # the round's last step ends here
            worst = max(worst, probe.longest_cpu)
            walls.append(wall)
            cpus.append(cpu)
            assert b.strategy.last is not None
            decided.append(len(b.strategy.last.decisions))
    gc.unfreeze()
    if case.moving and not case.dry_run:
        assert b.strategy.last is not None
        assert all(d.target != d.cur for d in b.strategy.last.decisions)
    return median(walls), median(cpus), median(decided), worst * 1000


async def main() -> None:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--dir", default=DEFAULT_DIR, help="parent dir of the synthetic node")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rounds = 6 if args.quick else 40
    runs = 1 if args.quick else args.runs
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for case in CASES:
            if case.pods == 200 and args.pods != 200:
                case = replace(case, pods=args.pods)
            walls, cpus, decided, steps = [], [], [], []
            for run in range(runs):
                wall, cpu, n_decided, step = await measure(Path(tmp) / f"{case.name}-{run}", case, rounds)
                walls.append(wall)
                cpus.append(cpu)
                decided.append(n_decided)
                steps.append(step)
            w, c = median(walls), median(cpus)
            rows.append(
                (
                    f"{case.name} ({case.pods} pods)",
                    f"{w:.2f}",
                    f"{c:.2f}",
                    f"{c * 1000 / case.pods:.1f}",
                    f"{median(decided):.0f}",
                    f"{median(steps):.2f}",
                )
            )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"CPUBurst round, LS pods x 1 container, {CPUS} CPUs; {machine()}; node in {tmp}; load {load}")
    print(f"median of {runs} runs x {rounds} rounds")
    print(
        table(
            rows,
            (
                "case",
                "wall ms/round",
                "CPU ms/round",
                "CPU µs/pod",
                "containers decided/round",
                "longest step, loop CPU ms",
            ),
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
