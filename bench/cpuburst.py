"""Per-round cost of the CPUBurst strategy at 200 LS pods (one 2-core container each), policy `auto`.

Synthetic cgroup v1 node (32 CPUs, cpu.cfs_burst_us present) in a temp dir, a metric store with node,
pod and container samples, and the real cgroup executor. Three cases:
* steady: quotas at their ceiling, static burst already written (cached) — the usual round;
* active: the node flips between idle and overloaded every round, so every container's quota moves
  (×1.2 / ×0.8: a read of container and pod quota and two writes per container, plus the burst writes);
* dry-run: the active case with the executor in dry-run (decisions recorded, nothing written).
The node lives on tmpfs (/dev/shm) by default: closer to cgroupfs than a disk-backed /tmp.

    python bench/cpuburst.py [--quick] [--runs N] [--pods N]
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from types import MappingProxyType

import structlog

from _common import machine, median, parser, table
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
DEFAULT_DIR = "/dev/shm" if Path("/dev/shm").is_dir() else None


class Bench:
    """A node with `n` LS pods and the strategy wired to a store whose clock the bench advances."""

    def __init__(self, base: Path, n: int, dry_run: bool) -> None:
        self.fs = SyntheticNode(base, cpus=CPUS, memory_total=256 * GiB, extensions=("cpu.cfs_burst_us",))
        self.now = 1000.0
        self.store = MetricStore(600, 1.0, clock=lambda: self.now)
        pods: dict[str, PodInfo] = {}
        self.cids: list[str] = []
        for i in range(n):
            cid = f"containerd://{i:064x}"
            pod = PodInfo(
                uid=f"uid-{i:04d}",
                namespace="bench",
                name=f"pod-{i}",
                labels={"koordinator.sh/qosClass": "LS"},
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
        slo = parse_nodeslo({"spec": {"cpuBurstStrategy": {"policy": "auto"}}})
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


async def measure(base: Path, n: int, case: str, rounds: int) -> tuple[float, float]:
    """Median (wall ms, CPU ms) per round for `case`."""
    b = Bench(base, n, dry_run=case == "dry-run")
    if case == "steady":
        for _ in range(8):  # grow to the ceiling, then stay there
            b.samples(1.0, 0.5)
            await b.round()
    walls, cpus = [], []
    for r in range(rounds):
        if case == "steady":
            b.samples(1.0, 0.0)
        else:  # idle+throttled (×1.2) and overloaded (×0.8) in turn: every quota moves every round
            b.samples(1.0 if r % 2 == 0 else CPUS * 0.9, 0.5)
        wall, cpu = await b.round()
        walls.append(wall)
        cpus.append(cpu)
    if case == "active":
        assert b.strategy.last is not None
        assert all(d.target != d.cur for d in b.strategy.last.decisions)
    return median(walls), median(cpus)


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
        for case in ("steady", "active", "dry-run"):
            walls, cpus = [], []
            for run in range(runs):
                wall, cpu = await measure(Path(tmp) / f"{case}-{run}", args.pods, case, rounds)
                walls.append(wall)
                cpus.append(cpu)
            w, c = median(walls), median(cpus)
            rows.append((case, f"{w:.2f}", f"{c:.2f}", f"{w * 1000 / args.pods:.1f}"))
    print(f"CPUBurst round, {args.pods} LS pods x 1 container, {CPUS} CPUs; {machine()}; node in {tmp}")
    print(f"median of {runs} runs x {rounds} rounds")
    print(table(rows, ("case", "wall ms/round", "CPU ms/round", "wall µs/pod")))


if __name__ == "__main__":
    asyncio.run(main())
