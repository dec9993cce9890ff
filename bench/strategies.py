"""Per-tick cost of the QoS strategies (CPU suppress, CPU evict, memory evict) at 200 pods.

Builds a synthetic node (cgroup v1 tree with 200 pod dirs, /proc, /sys) in a temp dir, a NodeState with
200 pods (half LS, half BE), a metric store with samples for every pod, and runs one strategy round
repeatedly: CPU suppress through the real cgroup executor (cfsQuota and cpuset policies), CPU and
memory eviction with every feature gate on and the node under pressure (candidate sorting and the full
eviction pass; the evictor refuses, so every candidate is tried: the worst case).

    python bench/strategies.py [--quick] [--pods N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

from koordqos.cgroups import CgroupExecutor, CgroupReader
from koordqos.config import build_config
from koordqos.decisions import DecisionLog
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricKind
from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.state import NodeState
from koordqos.strategies.cpuevict import CPUEvictStrategy
from koordqos.strategies.cpusuppress import CPUSuppressStrategy
from koordqos.strategies.framework import StrategyEnv
from koordqos.strategies.memoryevict import MemoryEvictStrategy
from koordqos.testing.fake_apiserver import make_pod
from koordqos.testing.nodefs import GiB, SyntheticNode
from koordqos.testing.strategyenv import strategy_env

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


async def time_rounds(strategy: Any, state: NodeState, env: StrategyEnv, rounds: int) -> float:
    """Median wall time of one round (ms) over `rounds` rounds after one warm-up round."""
    await strategy.run_once(state, env)
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await strategy.run_once(state, env)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few rounds (smoke run)")
    ap.add_argument("--pods", type=int, default=200)
    args = ap.parse_args()
    rounds = 5 if args.quick else 50
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("cfsQuota", "cpuset"):
            state, env = build(Path(tmp) / policy, args.pods, policy)
            results[f"CPUSuppress ({policy})"] = await time_rounds(CPUSuppressStrategy(), state, env, rounds)
        evict_cpu = CPUEvictStrategy(clock=lambda: 1e9)
        evict_cpu.last_evict = float("-inf")
        results["CPUEvict (3 triggers)"] = await time_rounds(evict_cpu, state, env, rounds)
        results["MemoryEvict (3 features)"] = await time_rounds(MemoryEvictStrategy(), state, env, rounds)
    print(f"QoS strategy round cost, {args.pods} pods, {CPUS} CPUs (median of {rounds} rounds)")
    print(f"{'strategy':<28} {'ms/round':>10}")
    for name, ms in results.items():
        print(f"{name:<28} {ms:>10.2f}")
    total = (
        results["CPUSuppress (cpuset)"]
        + results["CPUEvict (3 triggers)"]
        + results["MemoryEvict (3 features)"]
    )
    print(f"{'all enabled (cpuset)':<28} {total:>10.2f}")


if __name__ == "__main__":
    asyncio.run(main())
