"""MetricStore at steady state: a full retention window (600 one-second rounds) of pod and container series.

Reports the ingest cost of one collection round, the resident memory the samples take, and how long a full
garbage collection takes with the store filled (a full collection is one loop step in the agent).
Run: `python bench/store.py --pods 200,1000 --runs 3` (each run in a fresh process, so RSS is its own).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind

POD_KINDS = (MetricKind.POD_CPU_USAGE, MetricKind.POD_MEMORY_USAGE)
CONTAINER_KINDS = (
    MetricKind.CONTAINER_CPU_USAGE,
    MetricKind.CONTAINER_MEMORY_USAGE,
    MetricKind.CONTAINER_CPU_THROTTLED,
)


def one_run(pods: int, rounds: int) -> dict[str, float]:
    """Fill a store with `rounds` rounds of `pods` pods (2 containers each); measure in this process."""
    store = MetricStore(retention_seconds=600, collect_interval=1.0, clock=lambda: float(rounds))
    keys = [(k, f"pod{p}") for p in range(pods) for k in POD_KINDS]
    keys += [(k, f"c{p}-{c}") for p in range(pods) for c in range(2) for k in CONTAINER_KINDS]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gc.disable()
    spent = 0.0
    for r in range(rounds):
        samples: list[tuple[str, str, float | None]] = [(k, key, 0.5 + r) for k, key in keys]
        t0 = time.process_time()
        store._append(float(r), samples)
        spent += time.process_time() - t0
    gc.enable()
    collections = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        collections.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    return {
        "ingest_ms_per_round": spent / rounds * 1e3,
        "samples_mib": rss / 1024,
        "full_gc_ms": statistics.median(collections) * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", default="200,1000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--quick", action="store_true", help="smoke run: 50 pods, 60 rounds, 1 run")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one run in this process
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.rounds)))
        return
    sizes = [50] if args.quick else [int(p) for p in args.pods.split(",")]
    runs, rounds = (1, 60) if args.quick else (args.runs, args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f}; {rounds} rounds; median of {runs} runs")
    print(f"{'pods':>6} {'ingest ms/round':>16} {'samples MiB':>12} {'full GC ms':>11}")
    for pods in sizes:
        results = []
        for _ in range(runs):
            cmd = [sys.executable, __file__, "--one", str(pods), "--rounds", str(rounds)]
            results.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        ingest, mib, full_gc = med["ingest_ms_per_round"], med["samples_mib"], med["full_gc_ms"]
        print(f"{pods:>6} {ingest:>16.2f} {mib:>12.0f} {full_gc:>11.1f}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
