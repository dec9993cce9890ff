"""Benchmark: one metrics-collector round for 50 / 200 / 500 / 1,000 pods (CPU time, wall time, longest step).

Each pod has two started containers (half BE, half LS/Burstable); the synthetic cgroup tree lives on tmpfs
(/dev/shm when present), the closest stand-in for kernfs. A round = read /proc, every pod and container
cgroup, the BE aggregate, store the samples, publish the MetricTick. Budget: a 200-pod round <= 20 ms CPU.

    python bench/tick.py [--quick] [--runs N] [--version v1|v2] [--real] [--pods 50,200,500,1000]
                         [--container-metrics needed|cpu|all]

The longest loop step is measured by a probe task that yields in a loop (bench/_common.py LongestStep): wall
time between its wake-ups, and the loop thread's CPU time in that gap (what a step costs, whatever the load).

--real builds the pods as scratch cgroups on this machine's cgroup v1 hierarchy (root needed; removed
afterwards), so the reads hit kernfs instead of tmpfs.

--container-metrics picks the collector's container demand: `needed` (default, the agent's default: what CPU
burst reads; no NodeSLO here, so no container file), `cpu` (every pod's containers' CPU usage and throttling,
as when CPU burst's policy covers every pod), `all` (every container file: the agent's
`--container-metrics=all`, koordlet's behaviour).
"""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import LongestStep, machine, median, parser, percentile, table
from koordqos.agent import container_demand
from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import AgentConfig
from koordqos.events.types import PodUpserted
from koordqos.metrics.collector import ContainerDemand, MetricsCollector
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import ContainerSeries
from koordqos.model.keys import BATCH_CPU, LABEL_QOS
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.scratchcg import Scratch, unavailable_reason


@dataclass
class Result:
    """One run: per-round CPU and wall seconds, the longest loop step (wall, and loop-thread CPU)."""

    cpu: list[float]
    wall: list[float]
    longest: float
    longest_cpu: float


def make_pods(n: int) -> list[PodInfo]:
    """n pods, half BE (batch-cpu requests), half Burstable, two containers each."""
    pods = []
    for i in range(n):
        be = i % 2 == 0
        containers = tuple(
            ContainerInfo(
                name=f"c{j}",
                container_id=f"containerd://{i:06x}{j:02x}" + "ab" * 28,
                requests={BATCH_CPU: 500} if be else {"cpu": 500},
            )
            for j in range(2)
        )
        pods.append(
            PodInfo(
                uid=f"{i:08x}-0000-4000-8000-{i:012x}",
                namespace="bench",
                name=f"pod-{i}",
                kube_qos=KubeQoS.BESTEFFORT if be else KubeQoS.BURSTABLE,
                labels={LABEL_QOS: "BE"} if be else {},
                containers=containers,
            )
        )
    return pods


THREAD = False  # --thread: MetricsCollector(read_in_thread=True)


DEMAND = "needed"  # --container-metrics


def _collector_kw() -> dict[str, Any]:
    # only passed when asked for, so the benchmark also runs against a collector without the option
    kw: dict[str, Any] = {"read_in_thread": True} if THREAD else {}
    if DEMAND != "all":
        kw["container_demand"] = _demand(DEMAND)
    return kw


def _demand(choice: str) -> ContainerDemand | None:
    """The collector's container demand for --container-metrics."""
    if choice == "cpu":
        return lambda pod, state: ContainerSeries.CPU
    return container_demand(AgentConfig.model_validate({"metrics": {"container_metrics": choice}}), True)


async def measure(n: int, rounds: int, version: CgroupVersion, base: Path) -> Result:
    """CPU and wall seconds of `rounds` collector rounds over n pods (after one warm-up round)."""
    node = SyntheticNode(base, version, CgroupDriver.SYSTEMD, cpus=os.cpu_count() or 2)
    bus = EventBus()
    for pod in make_pods(n):
        node.add_pod(pod)
        await bus.publish(PodUpserted(pod))
    store = MetricStore()
    coll = MetricsCollector(
        bus,
        node.layout,
        CgroupReader(node.layout),
        store,
        proc_root=node.proc_root,
        topology=read_topology(node.sys_root),
        **_collector_kw(),
    )
    return await timed_rounds(coll, n, rounds)


async def timed_rounds(coll: MetricsCollector, n: int, rounds: int) -> Result:
    """CPU and wall seconds of `rounds` rounds after one warm-up round, and the longest loop step seen."""
    await coll.round()  # warm-up: first deltas, path memos, open files
    gc.collect()
    gc.freeze()  # the fixtures are not what is measured (the agent freezes after start-up too)
    cpu, wall = [], []
    with LongestStep() as probe:
        await asyncio.sleep(0)
        for _ in range(rounds):
            c0, w0 = time.process_time(), time.perf_counter()
            await coll.round()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
    gc.unfreeze()
    assert len(coll.last.pods if coll.last else {}) == n, "every pod measured"
    return Result(cpu, wall, probe.longest, probe.longest_cpu)


class _ScratchLayout(CgroupLayout):
    """A cgroupfs v1 layout whose kubepods tree lives under a scratch cgroup."""

    def __init__(self, prefix: str) -> None:
        super().__init__("/sys/fs/cgroup", CgroupVersion.V1, CgroupDriver.CGROUPFS)
        self.prefix = prefix

    def kubepods_dir(self) -> str:
        return f"{self.prefix}/{super().kubepods_dir()}"

    def qos_dir(self, kube_qos: KubeQoS) -> str:
        return f"{self.prefix}/{super().qos_dir(kube_qos)}"


async def measure_real(n: int, rounds: int) -> Result:
    """Like `measure`, on scratch cgroups of the real v1 hierarchy."""
    scratch = Scratch()
    try:
        scratch.mkcg("")
        layout = _ScratchLayout(scratch.name)
        for rel in ("kubepods", "kubepods/burstable", "kubepods/besteffort"):
            scratch.mkcg(rel)
        bus = EventBus()
        for pod in make_pods(n):
            pod_dir = layout.pod_dir(pod)
            scratch.mkcg(pod_dir.removeprefix(scratch.name + "/"))
            for c in pod.containers:
                scratch.mkcg(
                    layout.container_dir_in(pod_dir, c.container_id).removeprefix(scratch.name + "/")
                )
            await bus.publish(PodUpserted(pod))
        reader = CgroupReader(layout)
        coll = MetricsCollector(
            bus, layout, reader, MetricStore(), topology=read_topology("/sys"), **_collector_kw()
        )
        try:
            return await timed_rounds(coll, n, rounds)
        finally:
            reader.close()
    finally:
        scratch.cleanup()


def main() -> None:
    """Run the benchmark and print a table (median of runs; ms per round)."""
    ap = parser(__doc__ or "")
    ap.add_argument("--version", choices=["v1", "v2"], default="v1")
    ap.add_argument("--real", action="store_true", help="scratch cgroups on the real v1 hierarchy")
    ap.add_argument("--pods", default="50,200,500,1000", help="comma-separated pod counts")
    ap.add_argument("--thread", action="store_true", help="read the pods' files in a worker thread")
    ap.add_argument(
        "--container-metrics",
        choices=["needed", "cpu", "all"],
        default="needed",
        help="which container files the collector reads (see above)",
    )
    args = ap.parse_args()
    if args.real and (reason := unavailable_reason()):
        print(f"--real unavailable: {reason}")
        return
    version = CgroupVersion(args.version)
    global THREAD, DEMAND
    THREAD = args.thread
    DEMAND = args.container_metrics
    rounds = 5 if args.quick else 30
    runs = 1 if args.quick else args.runs
    tmp_parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    rows = []
    for n in [int(x) for x in args.pods.split(",")]:
        cpu_med, cpu_p90, wall_med, step, step_cpu = [], [], [], [], []
        for _ in range(runs):
            if args.real:
                r = asyncio.run(measure_real(n, rounds))
            else:
                with tempfile.TemporaryDirectory(dir=tmp_parent, prefix="koordqos-bench-") as d:
                    r = asyncio.run(measure(n, rounds, version, Path(d)))
            cpu_med.append(median(r.cpu) * 1e3)
            cpu_p90.append(percentile(r.cpu, 90) * 1e3)
            wall_med.append(median(r.wall) * 1e3)
            step.append(r.longest * 1e3)
            step_cpu.append(r.longest_cpu * 1e3)
        rows.append(
            (
                n,
                f"{median(cpu_med):.2f}",
                f"{median(cpu_p90):.2f}",
                f"{median(cpu_med) * 1e3 / n:.1f}",
                f"{median(wall_med):.2f}",
                f"{median(step):.2f}",
                f"{median(step_cpu):.2f}",
            )
        )
    where = "real cgroup v1 (kernfs) cgroupfs" if args.real else f"synthetic tmpfs cgroup {version} systemd"
    where += ", reads in a worker thread" if args.thread else ", reads on the loop"
    where += f", container metrics {args.container_metrics}"
    print(f"metrics collector round, {where}, {machine()}, {runs} runs x {rounds} rounds")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        table(
            rows,
            [
                "pods",
                "CPU ms (median)",
                "CPU ms (p90)",
                "CPU µs/pod",
                "wall ms (median)",
                "longest step ms (wall)",
                "longest step ms (loop CPU)",
            ],
        )
    )


if __name__ == "__main__":
    main()
