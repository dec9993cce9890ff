"""Per-tick cost of the QoS strategies (CPU suppress, CPU evict, memory evict, reconcile ones) at 200 pods.

Builds a synthetic node (cgroup v1 tree with 200 pod dirs, /proc, /sys) in a temp dir, a NodeState with
200 pods (half LS, half BE), a metric store with samples for every pod, and runs one strategy round
repeatedly: CPU suppress through the real cgroup executor (cfsQuota and cpuset policies), CPU and
memory eviction with every feature gate on and the node under pressure (candidate sorting and the full
eviction pass; the evictor refuses, so every candidate is tried: the worst case).

The reconcile strategies (CgroupReconcile, ResctrlReconcile, BlkioReconcile, SystemConfigReconcile) run on
a node with every kernel file they write (Anolis memcg knobs, resctrl with L3 CAT + MBA, blkio cost files,
sysctls) and a NodeSLO enabling all of them for LS and BE: the first round writes everything, then the
steady state is measured (CPU time per round, and the files written in it: it must be none).

    python bench/strategies.py [--quick] [--pods N] [--suppress-pods 200,1000] [--skip-reconcile]

The CPU suppress steady-state table also reports the writes each round planned (handed to the executor),
the files actually written, and the longest loop step (bench/_common.py LongestStep) at 200 and 1,000 pods.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

from _common import LongestStep
from koordqos.cgroups import CgroupExecutor, CgroupReader
from koordqos.config import build_config
from koordqos.decisions import DecisionLog
from koordqos.host import HostActuator
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricKind
from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.state import NodeState
from koordqos.strategies.blkio import BlkioReconcileStrategy
from koordqos.strategies.cpuevict import CPUEvictStrategy
from koordqos.strategies.cpusuppress import CPUSuppressStrategy
from koordqos.strategies.framework import StrategyEnv
from koordqos.strategies.memoryevict import MemoryEvictStrategy
from koordqos.strategies.memoryqos import CgroupReconcileStrategy
from koordqos.strategies.resctrl import ResctrlReconcileStrategy
from koordqos.strategies.sysconfig import SystemConfigStrategy
from koordqos.testing.nodefs import GiB, SyntheticNode
from koordqos.testing.strategyenv import strategy_env
from tests.support.fake_apiserver import make_pod

CPUS = 32


class RefusingEvictor:
    """Evictor stand-in: every eviction fails, so the pass walks every candidate (worst case)."""

    async def evict(self, pod: PodInfo, reason: str, message: str, strategy: str) -> bool:
        return False

    def is_evicted(self, pod: PodInfo) -> bool:
        return False


def build(base: Path, n_pods: int, policy: str) -> tuple[NodeState, StrategyEnv]:
    node_fs = SyntheticNode(base, cpus=CPUS, memory_total=256 * GiB)
    pods: dict[str, PodInfo] = {}
    now = time.time()
    store = MetricStore(600, 1.0, clock=lambda: now)  # frozen "now": building 200 pod dirs takes a while
    for i in range(n_pods):
        be = i % 2 == 0
        raw = make_pod(
            f"pod-{i}",
            "node-1",
            qos="BE" if be else "LS",
            uid=f"uid-{i:04d}",
            priority=5000 + i % 900 if be else 9500,
            requests={BATCH_CPU: "1000", BATCH_MEMORY: "1Gi"} if be else {"cpu": "500m", "memory": "1Gi"},
            labels={"koordinator.sh/eviction-enabled": "true"},
        )
        pod = parse_pod(raw)
        pods[pod.uid] = pod
        node_fs.add_pod(pod)
        store.add(MetricKind.POD_CPU_USAGE, pod.uid, 0.1 + (i % 7) * 0.05, now)
        store.add(MetricKind.POD_MEMORY_USAGE, pod.uid, (1 + i % 5) * GiB, now)
    store.add(MetricKind.NODE_CPU_USAGE, "", CPUS * 0.9, now)
    store.add(MetricKind.NODE_MEMORY_USAGE, "", 250 * GiB, now)
    for kind, v in (
        (MetricKind.BE_CPU_USAGE, 9500),
        (MetricKind.BE_CPU_REQUEST, 100_000),
        (MetricKind.BE_CPU_REAL_LIMIT, 10_000),
    ):
        store.add(kind, "", v, now - 0.5)
        store.add(kind, "", v, now)
    node = NodeInfo(
        name="node-1",
        capacity={"cpu": CPUS * 1000, "memory": 256 * GiB},
        allocatable={"cpu": CPUS * 1000, "memory": 256 * GiB, BATCH_CPU: 20_000, BATCH_MEMORY: 60 * GiB},
    )
    slo = parse_nodeslo(
        {
            "spec": {
                "resourceUsedThresholdWithBE": {
                    "enable": True,
                    "cpuSuppressPolicy": policy,
                    "cpuEvictBESatisfactionLowerPercent": 30,
                    "cpuEvictBESatisfactionUpperPercent": 40,
                    "cpuEvictThresholdPercent": 80,
                    "evictEnabledPriorityThreshold": 6000,
                    "cpuAllocatableEvictThresholdPercent": 80,
                    "cpuAllocatableEvictLowerPercent": 70,
                    "memoryAllocatableEvictThresholdPercent": 80,
                    "memoryAllocatableEvictLowerPercent": 70,
                    "allocatableEvictPriorityThreshold": 6000,
                    "memoryEvictThresholdPercent": 70,
                }
            }
        }
    )
    state = NodeState(pods=MappingProxyType(pods), node=node, node_slo=slo)
    gates = {
        g: True
        for g in (
            "BECPUEvict",
            "CPUEvict",
            "CPUAllocatableEvict",
            "BEMemoryEvict",
            "MemoryEvict",
            "MemoryAllocatableEvict",
        )
    }
    cfg = build_config(
        {
            "feature_gates": gates,
            "qos": {"cpu_evict_cool_time_seconds": 0, "memory_evict_cool_time_seconds": 0},
        }
    )
    decisions = DecisionLog(size=256)
    layout = node_fs.layout
    env = strategy_env(
        layout,
        decisions,
        config=cfg,
        store=store,
        reader=CgroupReader(layout),
        executor=CgroupExecutor(layout, decisions),
        topology=read_topology(node_fs.sys_root),
        evictor=RefusingEvictor(),
    )
    return state, env


async def suppress_rounds(
    strategy: CPUSuppressStrategy, state: NodeState, env: StrategyEnv, rounds: int
) -> tuple[float, float, float, int, float, float]:
    """CPU suppress steady state: (median wall ms, median CPU ms, writes planned per round (median), files
    written in all rounds, longest loop step wall ms, longest loop step loop-CPU ms), after two settling
    rounds (the first writes the suppressed cpusets/quota)."""
    await strategy.run_once(state, env)
    await strategy.run_once(state, env)
    gc.collect()
    gc.freeze()
    before = env.executor.file_writes
    walls, cpus, planned = [], [], []
    with LongestStep() as probe:
        await asyncio.sleep(0)
        for _ in range(rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            await strategy.run_once(state, env)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            planned.append(len(strategy.last_plan.writes) if strategy.last_plan is not None else 0)
    gc.unfreeze()
    return (
        statistics.median(walls) * 1000,
        statistics.median(cpus) * 1000,
        statistics.median(planned),
        env.executor.file_writes - before,
        probe.longest * 1000,
        probe.longest_cpu * 1000,
    )


async def time_rounds(strategy: Any, state: NodeState, env: StrategyEnv, rounds: int) -> float:
    """Median wall time of one round (ms) over `rounds` rounds after one warm-up round."""
    await strategy.run_once(state, env)
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await strategy.run_once(state, env)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


RECONCILE_EXTENSIONS = (
    "memory.min",
    "memory.low",
    "memory.high",
    "memory.wmark_ratio",
    "memory.wmark_scale_factor",
    "memory.wmark_min_adj",
    "memory.priority",
    "memory.use_priority_oom",
    "memory.oom.group",
    "blkio.cost.weight",
)
RECONCILE_SLO = {
    "resourceQOSStrategy": {
        "lsClass": {
            "memoryQOS": {
                "enable": True,
                "minLimitPercent": 50,
                "lowLimitPercent": 60,
                "throttlingPercent": 80,
            },
            "resctrlQOS": {"enable": True, "catRangeStartPercent": 0, "catRangeEndPercent": 100},
        },
        "beClass": {
            "memoryQOS": {"enable": True, "minLimitPercent": 10, "throttlingPercent": 90, "priority": 2},
            "resctrlQOS": {
                "enable": True,
                "catRangeStartPercent": 0,
                "catRangeEndPercent": 30,
                "mbaPercent": 50,
            },
            "blkioQOS": {
                "enable": True,
                "blocks": [
                    {"name": "/dev/vdb", "type": "device", "ioCfg": {"readIOPS": 1000, "writeBPS": 1 << 20}}
                ],
            },
        },
    },
    "systemStrategy": {"minFreeKbytesFactor": 88, "watermarkScaleFactor": 99, "memcgReapBackGround": 1},
}


def build_reconcile(base: Path, n_pods: int) -> tuple[NodeState, StrategyEnv]:
    """200 pods (LS Burstable with memory, BE with batch memory), each with 8 threads, on a full node."""
    node_fs = SyntheticNode(base, cpus=CPUS, memory_total=256 * GiB, extensions=RECONCILE_EXTENSIONS)
    node_fs.add_resctrl("7ff", (0, 1))
    for g in ("LSR", "LS", "BE"):
        (node_fs.resctrl_root / g).mkdir()
        (node_fs.resctrl_root / g / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
        (node_fs.resctrl_root / g / "tasks").write_text("")
    node_fs.add_sysctls(memcg_reaper="0")
    node_fs.add_block_device("vdb", "253:16")
    pods: dict[str, PodInfo] = {}
    for i in range(n_pods):
        be = i % 2 == 0
        raw = make_pod(
            f"pod-{i}",
            "node-1",
            qos="BE" if be else "LS",
            uid=f"uid-{i:04d}",
            requests={BATCH_MEMORY: "1Gi"} if be else {"memory": "1Gi"},
            limits={BATCH_MEMORY: "2Gi"} if be else {"memory": "2Gi"},
        )
        raw["status"]["qosClass"] = "BestEffort" if be else "Burstable"
        pod = parse_pod(raw)
        pods[pod.uid] = pod
        node_fs.add_pod(pod)
        cdir = node_fs.layout.container_dir(pod, pod.containers[0].container_id)
        node_fs.set_threads(cdir, range(10_000 + i * 8, 10_008 + i * 8))
    node = NodeInfo(
        name="node-1",
        capacity={"cpu": CPUS * 1000, "memory": 256 * GiB},
        allocatable={"cpu": CPUS * 1000, "memory": 256 * GiB},
    )
    state = NodeState(pods=MappingProxyType(pods), node=node, node_slo=parse_nodeslo({"spec": RECONCILE_SLO}))
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": node_fs.cgroup_root,
                "proc_root": node_fs.proc_root,
                "sys_root": node_fs.sys_root,
            }
        }
    )
    decisions = DecisionLog(size=256)
    layout = node_fs.layout
    env = strategy_env(
        layout,
        decisions,
        config=cfg,
        executor=CgroupExecutor(layout, decisions),
        host=HostActuator(decisions, proc_root=node_fs.proc_root, sys_root=node_fs.sys_root),
    )
    return state, env


def files_written(env: StrategyEnv) -> int:
    """Cgroup files written plus host decisions of kind write (the host actuator has no write counter)."""
    host_writes = sum(1 for d in env.decisions.recent() if d.action in ("write", "add-tasks", "create-group"))
    return int(env.executor.file_writes) + host_writes


async def reconcile_rounds(
    strategy: Any, state: NodeState, env: StrategyEnv, rounds: int
) -> tuple[float, float, float, int]:
    """(first round wall ms, its longest loop step ms, median steady-state CPU ms, files written steady).

    The built node is frozen out of the garbage collector first, as the agent does after start-up: a full
    collection over the benchmark's own 200-pod fixtures would otherwise be what the longest step measures.
    """
    gc.collect()
    gc.freeze()
    await asyncio.sleep(0)
    with LongestStep() as probe:
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        await strategy.run_once(state, env)
        first = (time.perf_counter() - t0) * 1000
    await strategy.run_once(state, env)  # settles what the first round could not know (e.g. new groups)
    before = files_written(env)
    samples = []
    for _ in range(rounds):
        c0 = time.process_time()
        await strategy.run_once(state, env)
        samples.append(time.process_time() - c0)
    return first, probe.longest * 1000, statistics.median(samples) * 1000, files_written(env) - before


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few rounds (smoke run)")
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument(
        "--suppress-pods", default="200,1000", help="pod counts of the CPU suppress steady-state table"
    )
    ap.add_argument("--skip-reconcile", action="store_true", help="only the QoS strategy tables")
    args = ap.parse_args()
    args.suppress_pods = [int(x) for x in args.suppress_pods.split(",") if x]
    rounds = 5 if args.quick else 50
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results: dict[str, float] = {}
    suppress: dict[tuple[str, int], tuple[float, float, float, int, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted({args.pods, *args.suppress_pods}):
            for policy in ("cfsQuota", "cpuset"):
                state, env = build(Path(tmp) / f"{policy}-{n}", n, policy)
                suppress[(policy, n)] = await suppress_rounds(CPUSuppressStrategy(), state, env, rounds)
                if n == args.pods:
                    results[f"CPUSuppress ({policy})"] = suppress[(policy, n)][0]
        state, env = build(Path(tmp) / "evict", args.pods, "cpuset")
        evict_cpu = CPUEvictStrategy(clock=lambda: 1e9)
        evict_cpu.last_evict = float("-inf")
        results["CPUEvict (3 triggers)"] = await time_rounds(evict_cpu, state, env, rounds)
        results["MemoryEvict (3 features)"] = await time_rounds(MemoryEvictStrategy(), state, env, rounds)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"QoS strategy round cost, {args.pods} pods, {CPUS} CPUs (median of {rounds} rounds); load {load}")
    print(f"{'strategy':<28} {'ms/round':>10}")
    for name, ms in results.items():
        print(f"{name:<28} {ms:>10.2f}")
    total = (
        results["CPUSuppress (cpuset)"]
        + results["CPUEvict (3 triggers)"]
        + results["MemoryEvict (3 features)"]
    )
    print(f"{'all enabled (cpuset)':<28} {total:>10.2f}")
    print()
    print(f"CPUSuppress steady state (median of {rounds} rounds after 2 settling rounds)")
    print(
        f"{'policy':<10} {'pods':>6} {'wall ms':>9} {'CPU ms':>8} {'planned writes':>15} "
        f"{'files written':>14} {'longest step ms':>16} {'step loop-CPU ms':>17}"
    )
    for (policy, n), (wall, cpu, planned, written, step, step_cpu) in suppress.items():
        print(
            f"{policy:<10} {n:>6} {wall:>9.2f} {cpu:>8.2f} {planned:>15.0f} {written:>14} "
            f"{step:>16.2f} {step_cpu:>17.2f}"
        )

    if args.skip_reconcile:
        return
    reconcile: dict[str, tuple[float, float, float, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, factory in (
            ("CgroupReconcile", CgroupReconcileStrategy),
            ("ResctrlReconcile", ResctrlReconcileStrategy),
            ("BlkioReconcile", BlkioReconcileStrategy),
            ("SystemConfigReconcile", SystemConfigStrategy),
        ):
            state, env = build_reconcile(Path(tmp) / name, args.pods)
            reconcile[name] = await reconcile_rounds(factory(), state, env, rounds)
    print()
    print(
        f"Reconcile strategies, {args.pods} pods: first round (wall), steady state (CPU, median of {rounds})"
    )
    print(
        f"{'strategy':<24} {'first ms':>10} {'longest step':>13} {'steady CPU ms':>14} {'files written':>14}"
    )
    for name, (first, step, steady, written) in reconcile.items():
        print(f"{name:<24} {first:>10.2f} {step:>13.2f} {steady:>14.3f} {written:>14}")


if __name__ == "__main__":
    asyncio.run(main())
