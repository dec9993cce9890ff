"""Benchmark: cgroup executor throughput (intents per second) by outcome, synthetic tree and real cgroup v1.

Cases, each a batch of intents over 100 pod dirs applied with `CgroupExecutor.apply`:
* written   — cpu.shares alternating between two values (read + compare + write + decision record)
* unchanged — same value again, not cacheable (read + compare, no write)
* cached    — same value again, cacheable (cache hit: no I/O)
* memory    — memory.limit_in_bytes alternating (the write goes through a worker thread)
The synthetic tree lives on tmpfs (/dev/shm); the real cases use scratch cgroups under /sys/fs/cgroup (v1,
root) and are skipped with a message when that is not writable. Decisions are logged as JSON to /dev/null.

    python bench/executor.py [--quick] [--runs N]
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from _common import machine, median, parser, table
from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome
from koordqos.cgroups.layout import CgroupLayout
from koordqos.decisions import DecisionLog
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.scratchcg import Scratch, unavailable_reason

PODS = 100


def quiet_json_logs() -> None:
    """Decision log lines rendered as JSON (as in production) but written to /dev/null."""
    structlog.configure(
        processors=[structlog.processors.TimeStamper(fmt="iso"), structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=open(os.devnull, "w")),  # noqa: SIM115
        cache_logger_on_first_use=True,
    )


Case = Callable[[int], list[CgroupWrite]]


def cases(dirs: list[str]) -> dict[str, tuple[Case, Outcome]]:
    """Intent generators by case name (argument: iteration number) and the outcome they must produce."""
    return {
        "written": (
            lambda i: [CgroupWrite(d, "cpu.shares", 512 + i % 2, Level.POD, False) for d in dirs],
            Outcome.WRITTEN,
        ),
        "unchanged": (
            lambda i: [CgroupWrite(d, "cpu.shares", 700, Level.POD, False) for d in dirs],
            Outcome.UNCHANGED,
        ),
        "cached": (
            lambda i: [CgroupWrite(d, "cpu.shares", 800, Level.POD, True) for d in dirs],
            Outcome.CACHED,
        ),
        "memory": (
            lambda i: [
                CgroupWrite(d, "memory.limit_in_bytes", (256 << 20) + 4096 * (i % 2), Level.POD, False)
                for d in dirs
            ],
            Outcome.WRITTEN,
        ),
    }


async def run_case(ex: CgroupExecutor, case: Case, expect: Outcome, iters: int) -> float:
    """Intents per second for `iters` batches (after two warm-up batches that set the start state)."""
    for i in range(2):
        await ex.apply("bench", case(i))
    n = 0
    t0 = time.perf_counter()
    for i in range(iters):
        results = await ex.apply("bench", case(i))
        n += len(results)
    dt = time.perf_counter() - t0
    assert all(r.outcome is expect for r in results), {r.outcome for r in results}
    return n / dt


def measure(layout: CgroupLayout, dirs: list[str], iters: int) -> dict[str, float]:
    """Intents per second by case."""
    out = {}
    for name, (case, expect) in cases(dirs).items():
        ex = CgroupExecutor(layout, DecisionLog())
        out[name] = asyncio.run(run_case(ex, case, expect, iters))
    return out


def synthetic(iters: int) -> dict[str, float]:
    """Throughput on a synthetic tmpfs tree."""
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=parent, prefix="koordqos-bench-") as d:
        node = SyntheticNode(Path(d))
        dirs = []
        for i in range(PODS):
            rel = f"kubepods/besteffort/pod{i:04d}"
            node.make_cgroup(rel)
            dirs.append(rel)
        return measure(node.layout, dirs, iters)


def real(iters: int) -> dict[str, float] | None:
    """Throughput on scratch cgroups of the real v1 hierarchy (None when unavailable)."""
    reason = unavailable_reason()
    if reason:
        print(f"real cgroup v1 cases skipped: {reason}")
        return None
    s = Scratch()
    try:
        s.mkcg("")
        dirs = [s.mkcg(f"pod{i:04d}") for i in range(PODS)]
        return measure(s.layout, dirs, iters)
    finally:
        s.cleanup()


POD_FILES = ("cpu.shares", "cpu.cfs_quota_us", "cpu.bvt_warp_ns", "memory.limit_in_bytes", "cpuset.cpus")
CONTAINER_FILES = ("cpu.shares", "cpu.cfs_quota_us", "cpu.bvt_warp_ns", "memory.limit_in_bytes", "cpu.idle")


def forget_pod_costs(pods: int = 1000, forgotten: int = 100) -> tuple[float, float, float]:
    """With `pods` pods' values cached (5 pod-level, 2 containers × 5 each): µs to forget one pod
    (`invalidate`, as a RemovePodSandbox does), and µs per cache hit before and after `forgotten` pods were
    forgotten within the period (no I/O: the cache alone)."""
    ex = CgroupExecutor(CgroupLayout(Path("/nonexistent")), DecisionLog())
    pod_dirs = [f"kubepods/besteffort/pod{i:08d}-aaaa-bbbb-cccc-000000000000" for i in range(pods)]
    gone = pod_dirs[pods - forgotten :]
    hits: list[CgroupWrite] = []
    for pod in pod_dirs:
        for r in POD_FILES:
            ex._remember(CgroupWrite(pod, r, "1"))
        for c in range(2):
            for r in CONTAINER_FILES:
                w = CgroupWrite(f"{pod}/{c:064d}", r, "1")
                ex._remember(w)
                hits.append(w)

    def per_hit() -> float:
        cache_hit = ex._cache_hit
        start = time.perf_counter()
        for w in hits:
            cache_hit(w)
        return (time.perf_counter() - start) / len(hits) * 1e6

    before = min(per_hit() for _ in range(3))
    took = []
    for pod in gone:
        start = time.perf_counter()
        ex.invalidate(pod)
        took.append(time.perf_counter() - start)
    after = min(per_hit() for _ in range(3))
    # what was forgotten is a miss, the rest still a hit (checked outside the timed loops)
    forgotten_dirs = tuple(gone)
    assert all(ex._cache_hit(w) != w.parent.startswith(forgotten_dirs) for w in hits)
    return median(took) * 1e6, before, after


def main() -> None:
    """Run the benchmark and print intents/second (median of runs)."""
    args = parser(__doc__ or "").parse_args()
    quiet_json_logs()
    iters = 3 if args.quick else 20
    runs = 1 if args.quick else args.runs
    results: dict[str, dict[str, list[float]]] = {"synthetic tmpfs": {}, "real cgroup v1": {}}
    for _ in range(runs):
        for tree, fn in (("synthetic tmpfs", synthetic), ("real cgroup v1", real)):
            r = fn(iters)
            for case, rate in (r or {}).items():
                results[tree].setdefault(case, []).append(rate)
    rows = []
    for tree, by_case in results.items():
        for case, rates in by_case.items():
            rate = median(rates)
            rows.append((tree, case, f"{rate:,.0f}", f"{1e6 / rate:.1f}"))
    print(f"cgroup executor, {PODS} dirs per batch, {machine()}, {runs} runs x {iters} batches")
    print(table(rows, ["tree", "case", "intents/s (median)", "µs per intent"]))
    costs = [forget_pod_costs() for _ in range(runs)]
    forget, hit, hit_after = (median([c[i] for c in costs]) for i in range(3))
    print(
        f"forget one pod (RemovePodSandbox) with 1,000 pods' values cached: {forget:,.1f} µs; a cache hit "
        f"{hit:.2f} µs, {hit_after:.2f} µs with 100 pods forgotten within the period (median of {runs} runs)"
    )


if __name__ == "__main__":
    main()
