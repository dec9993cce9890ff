"""Node prediction at scale: the models' memory and the longest loop step of each sliced phase.

* memory: N pods (varied usage, so their histograms span many buckets) plus the 7 node-level models after a
  day of training rounds; the weight arrays (`ModelStore.nbytes`) and everything Python allocates for the
  models (tracemalloc), per model and in total.
* loop steps: with one minute of 1 s samples of N pods in the report history, the longest synchronous slice
  (the time between two yields to the event loop) of a training round (sampling + training), of the report's
  prediction fields (the predictors over every pod), of a checkpoint round's encoding (12 models) and of a
  restore (reading, decoding and loading N checkpoint files). Steps are measured in the loop thread's CPU
  time: on a shared machine the wall time also counts the other processes' turns.

Run: `python bench/prediction.py --pods 200,1000` (`--quick`: 50 pods). Figures: docs/prediction.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
import tracemalloc
from collections.abc import Coroutine, Generator
from pathlib import Path
from tempfile import TemporaryDirectory
from types import MappingProxyType
from typing import Any

from koordqos.bus import EventBus
from koordqos.metrics.types import MetricSnapshot, NodeSample, PodSample
from koordqos.model.node import parse_node
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.prediction.checkpoint import CheckpointDir, encode
from koordqos.prediction.model import (
    NS,
    ModelStore,
    PodUsage,
    PredictionParams,
    RoundSamples,
    train,
    train_steps,
)
from koordqos.report.history import ReportHistory
from koordqos.report.prediction import PredictionServer, round_samples_steps
from koordqos.state import NodeState

Gi = 1 << 30
T0 = 1767225600 * NS


def pods_of(n: int) -> list[PodInfo]:
    out = []
    for i in range(n):
        out.append(
            parse_pod(
                {
                    "metadata": {
                        "uid": f"00000000-0000-4000-8000-{i:012d}",
                        "name": f"p{i}",
                        "namespace": "bench",
                        "creationTimestamp": "2025-01-01T00:00:00Z",
                    },
                    "spec": {
                        "priority": 9000 if i % 2 else 5000,
                        "containers": [
                            {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
                        ],
                    },
                    "status": {"phase": "Running"},
                }
            )
        )
    return out


def trained_store(pods: list[PodInfo], rounds: int) -> ModelStore:
    """`rounds` one-minute rounds of varied usage (0.05–4 cores, 64 MiB–8 GiB per pod)."""
    rng = random.Random(7)
    store = ModelStore()
    for k in range(rounds):
        usage = [
            PodUsage(p.uid, p.priority_class.value, rng.uniform(0.05, 4.0), rng.uniform(64 << 20, 8 * Gi))
            for p in pods
        ]
        train(store, RoundSamples(usage, 0.5 * len(pods), 4.0 * Gi * len(pods)), T0 + k * 60 * NS)
    return store


def memory(n: int, rounds: int) -> dict[str, float]:
    pods = pods_of(n)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    store = trained_store(pods, rounds)
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    models = len(store)
    return {
        "models": models,
        "array_mb": store.nbytes() / 1e6,
        "traced_mb": traced / 1e6,
        "per_model_kb": traced / models / 1e3,
    }


def longest_step(steps: Generator[None, None, Any]) -> tuple[float, Any]:
    """Drive a sliced generator as the agent does; the longest slice (seconds of this thread's CPU time:
    on a shared machine a preemption is not the agent's step) and its result."""
    worst = 0.0
    while True:
        t0 = time.thread_time()
        try:
            next(steps)
        except StopIteration as done:
            return max(worst, time.thread_time() - t0), done.value
        worst = max(worst, time.thread_time() - t0)


def steps(n: int, rounds: int) -> dict[str, float]:
    pods = pods_of(n)
    now = [3600.0]
    history = ReportHistory(1.0, clock=lambda: now[0])
    rng = random.Random(3)
    for s in range(61):
        now[0] = 3600.0 - 60 + s
        samples = {
            p.uid: PodSample(p.uid, rng.uniform(0.05, 4.0), None, (), int(rng.uniform(64 << 20, 8 * Gi)))
            for p in pods
        }
        node = NodeSample(cpu_usage_cores=0.5 * n, memory_used=4 * Gi * n)
        history.ingest(MetricSnapshot(now[0], 1.0, node, MappingProxyType(samples)))
    node = parse_node({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "512", "memory": "4Ti"}}})
    state = NodeState(pods=MappingProxyType({p.uid: p for p in pods}), node=node)
    server = PredictionServer(EventBus(state=state), history, PredictionParams(), offload=False)
    server.store = trained_store(pods, rounds)
    sample_s, samples_ = longest_step(round_samples_steps(history, pods, now[0], 60.0))
    train_s, _ = longest_step(train_steps(server.store, samples_, T0 + rounds * 60 * NS))
    fields = server.fields(state, T0 / NS + rounds * 60)
    predict_s, out = longest_step(fields([p.uid for p in pods]))
    assert "prodPeakMetric" in out, out
    # a checkpoint round's loop part: encoding the due models (12)
    t0 = time.thread_time()
    for uid in list(server.store.models)[:12]:
        m = server.store.models[uid]
        encode(uid, m.cpu.save(), m.memory.save(), T0)
    encode_s = time.thread_time() - t0
    restore_s = restore_step(server, state)
    return {
        "sample_ms": sample_s * 1e3,
        "train_ms": train_s * 1e3,
        "predict_ms": predict_s * 1e3,
        "encode12_ms": encode_s * 1e3,
        "restore_ms": restore_s * 1e3,
    }


async def max_loop_step(work: Coroutine[Any, Any, Any]) -> float:
    """Run `work` on this loop beside a ticker that only yields: the longest gap (the loop thread's CPU time)
    between two of its turns is the longest step anything else took on the loop."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        last = time.thread_time()
        while not done:
            await asyncio.sleep(0)
            now = time.thread_time()
            worst = max(worst, now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        await work
    finally:
        done = True
        await tick
    return worst


def restore_step(server: PredictionServer, state: NodeState) -> float:
    """The longest loop step of a restore of every model from its file (RESTORE_PER_STEP files read,
    decoded and loaded a step)."""
    with TemporaryDirectory() as d:
        for uid, m in server.store.models.items():
            (Path(d) / uid).write_bytes(encode(uid, m.cpu.save(), m.memory.save(), T0))
        fresh = PredictionServer(EventBus(state=state), server.history, server.params, CheckpointDir(Path(d)))
        worst = asyncio.run(max_loop_step(fresh.restore()))
        assert len(fresh.store) == len(server.store)
        return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", default="200,1000")
    ap.add_argument("--rounds", type=int, default=1440, help="one-minute training rounds before measuring")
    ap.add_argument("--quick", action="store_true", help="smoke run: 50 pods, 60 rounds")
    args = ap.parse_args()
    sizes = [50] if args.quick else [int(p) for p in args.pods.split(",")]
    rounds = 60 if args.quick else args.rounds
    print(f"load average {os.getloadavg()[0]:.2f}; {rounds} training rounds of varied usage")
    print(f"{'pods':>6} {'models':>7} {'arrays MB':>10} {'traced MB':>10} {'KB/model':>9}")
    for n in sizes:
        m = memory(n, rounds)
        row = f"{n:>6} {m['models']:>7.0f} {m['array_mb']:>10.2f} {m['traced_mb']:>10.2f}"
        print(f"{row} {m['per_model_kb']:>9.2f}")
    print("longest loop step (CPU ms) of each phase, median of 5 runs")
    print(f"{'pods':>6} {'sample':>7} {'train':>7} {'predict':>8} {'encode 12':>10} {'restore':>8}")
    for n in sizes:
        runs = [steps(n, min(rounds, 120)) for _ in range(1 if args.quick else 5)]
        s = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"{n:>6} {s['sample_ms']:>7.2f} {s['train_ms']:>7.2f} {s['predict_ms']:>8.2f}"
            f" {s['encode12_ms']:>10.2f} {s['restore_ms']:>8.2f}"
        )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
