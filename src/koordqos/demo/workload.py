"""The demo's workload processes: LS latency probes and BE pods' processes.

`python -m koordqos.demo.workload probe --mode memory --iterations N --period-ms 5` runs a probe: every
period it does a fixed amount of work and reports, per slot, the time from the slot's *scheduled* start to
the end of the work (so wake-up delay, preemption, throttling and slower memory all count, and a probe that
falls behind is not excused: no coordinated omission). It prints one line per report interval:
`<monotonic end of interval> <latency µs> <latency µs> ...`. The work is, by `--mode`:
* `memory` (default): N reads at random offsets of a `--buffer-mib` buffer (16 MiB: far more than a core's
  L2, so the reads depend on the shared L3 and memory bandwidth; random, so no prefetcher hides them);
* `cpu`: N iterations of a loop that stays in the core's own caches (only CPU time matters).
N is calibrated (`calibrate`) to `--work-ms` on an idle CPU.

`python -m koordqos.demo.workload burn --mode stream` runs a BE process: `stream` copies a `--buffer-mib`
buffer (64 MiB) over and over, eating memory bandwidth and the shared cache, which CFS shares cannot stop
when it runs on another CPU than the probe; `spin` only spins (CPU, nothing shared beyond the core).

Each process pins itself to `--cpus` (a list like `0` or `1-3`) when given. All exit when their stdin
closes or on SIGTERM, so no orphan outlives the demo.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from koordqos.model.cpuset import format_cpuset

REPORT_SECONDS = 0.1
#: A probe more than this far behind its schedule restarts it (the slots it missed are counted as one).
MAX_BACKLOG_SECONDS = 0.1
PROBE_MODES = ("memory", "cpu")
BURN_MODES = ("stream", "spin")
MIB = 1 << 20
STREAM_CHUNK = 4 * MIB
SEED = 37
CALIBRATION_ROUNDS = 4


def spin(iterations: int) -> int:
    """The `cpu` probe's unit of work."""
    acc = 0
    for i in range(iterations):
        acc ^= i
    return acc


def memory_walk(buffer_mib: int, reads: int, seed: int = SEED) -> Callable[[], int]:
    """The `memory` probe's unit of work: `reads` reads at fixed random offsets of a `buffer_mib` buffer."""
    size = buffer_mib * MIB
    buf = bytearray(os.urandom(MIB)) * buffer_mib  # touched: every page is resident before the first slot
    rnd = random.Random(seed)
    offsets = [rnd.randrange(size) for _ in range(reads)]

    def walk() -> int:
        acc = 0
        for i in offsets:
            acc += buf[i]
        return acc

    return walk


def work_unit(mode: str, iterations: int, buffer_mib: int) -> Callable[[], int]:
    """One slot's work of a probe of `mode`."""
    if mode == "memory":
        return memory_walk(buffer_mib, iterations)
    if mode == "cpu":
        return lambda: spin(iterations)
    raise ValueError(f"unknown probe mode {mode!r} (one of {', '.join(PROBE_MODES)})")


def _seconds(unit: Callable[[], int], trials: int, pause: float) -> float:
    """Best of `trials` back to back (`pause` 0), or the median of `trials` each after `pause` seconds
    of sleep (as the probe runs: after a sleep the caches are what the machine left of them)."""
    took = []
    for _ in range(trials):
        if pause:
            time.sleep(pause)
        start = time.perf_counter()
        unit()
        took.append(time.perf_counter() - start)
    return min(took) if not pause else sorted(took)[len(took) // 2]


def calibrate(
    work_ms: float, mode: str = "cpu", buffer_mib: int = 16, trials: int = 15, period_ms: float = 0.0
) -> int:
    """Iterations of `mode`'s work taking `work_ms` on an idle CPU (`cpu`: best of `trials`, interference
    only adds time). A memory walk's cost per read depends on how many distinct lines it touches and on
    what the caches kept while the probe slept, so its count is refined on walks of the count itself, run
    as the probe runs them: one per `period_ms`, the median of `trials`."""
    target = work_ms / 1000
    trial = 20_000 if mode == "cpu" else 2_000
    n = max(1, round(trial * target / _seconds(work_unit(mode, trial, buffer_mib), trials, 0.0)))
    if mode == "memory":
        pause = max(0.0, period_ms - work_ms) / 1000
        for _ in range(CALIBRATION_ROUNDS):
            took = _seconds(work_unit(mode, n, buffer_mib), trials, pause)
            n = max(1, round(n * target / took))
    return n


def parse_cpus(text: str) -> list[int]:
    """A CPU list as the kernel writes it (`0`, `1-3`, `0,2-3`), sorted; ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def split_cpus(cpus: Sequence[int], ls_count: int) -> tuple[list[int], list[int]]:
    """(LS CPUs, the others: BE's and the demo's own) from the CPUs this process may use; with one CPU, or
    `ls_count` 0, both get every CPU (no split)."""
    ordered = sorted(cpus)
    if ls_count <= 0 or len(ordered) < 2:
        return ordered, ordered
    n = min(ls_count, len(ordered) - 1)
    return ordered[:n], ordered[n:]


@dataclass(frozen=True)
class ProbeArgs:
    """How a probe process runs (its command line)."""

    mode: str
    iterations: int
    period_ms: float
    buffer_mib: int = 16
    cpus: tuple[int, ...] = ()

    def argv(self) -> list[str]:
        """The `koordqos.demo.workload` arguments."""
        out = ["probe", "--mode", self.mode, "--iterations", str(self.iterations)]
        out += ["--period-ms", f"{self.period_ms:g}", "--buffer-mib", str(self.buffer_mib)]
        return out + (["--cpus", format_cpuset(self.cpus)] if self.cpus else [])


@dataclass(frozen=True)
class BurnArgs:
    """How a BE process runs (its command line)."""

    mode: str = "stream"
    buffer_mib: int = 64
    cpus: tuple[int, ...] = ()

    def argv(self) -> list[str]:
        """The `koordqos.demo.workload` arguments."""
        out = ["burn", "--mode", self.mode, "--buffer-mib", str(self.buffer_mib)]
        return out + (["--cpus", format_cpuset(self.cpus)] if self.cpus else [])


def _exit_when_stdin_closes() -> None:
    """The parent holds our stdin: when it goes away (even SIGKILLed), so do we."""

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(1):
                pass
        finally:
            os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def probe(work: Callable[[], int], period_ms: float) -> None:
    """Run the probe loop (see the module docstring)."""
    period = period_ms / 1000
    out = sys.stdout
    batch: list[str] = []
    now = time.monotonic()
    scheduled = now
    report_at = now + REPORT_SECONDS
    while True:
        scheduled += period
        now = time.monotonic()
        if scheduled > now:
            time.sleep(scheduled - now)
        elif now - scheduled > MAX_BACKLOG_SECONDS:
            scheduled = now
        work()
        end = time.monotonic()
        batch.append(str(round((end - scheduled) * 1e6)))
        if end >= report_at:
            out.write(f"{end:.6f} {' '.join(batch)}\n")
            out.flush()
            batch.clear()
            report_at = end + REPORT_SECONDS


def burn(mode: str, buffer_mib: int) -> None:
    """Spin, or stream copies of a buffer, forever."""
    if mode == "spin":
        while True:
            pass
    half = max(1, buffer_mib // 2) * MIB
    src = memoryview(bytearray(os.urandom(MIB)) * (half // MIB))
    dst = memoryview(bytearray(half))
    while True:
        for off in range(0, half, STREAM_CHUNK):
            dst[off : off + STREAM_CHUNK] = src[off : off + STREAM_CHUNK]


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _cpu_list(text: str) -> list[int]:
    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The workload's command line (argparse exits with 2 on a bad one)."""
    p = argparse.ArgumentParser(description="koordqos demo workload")
    sub = p.add_subparsers(dest="kind", required=True)
    pr = sub.add_parser("probe")
    pr.add_argument("--mode", choices=PROBE_MODES, default="memory")
    pr.add_argument("--iterations", type=_positive_int, required=True)
    pr.add_argument("--period-ms", type=_positive_float, default=5.0)
    pr.add_argument("--buffer-mib", type=_positive_int, default=16)
    pr.add_argument("--cpus", type=_cpu_list, default=None)
    bu = sub.add_parser("burn")
    bu.add_argument("--mode", choices=BURN_MODES, default="spin")
    bu.add_argument("--buffer-mib", type=_positive_int, default=64)
    bu.add_argument("--cpus", type=_cpu_list, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Entry point of a workload process."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the demo, which stops us in order
    _exit_when_stdin_closes()
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    try:
        if args.kind == "probe":
            probe(work_unit(args.mode, args.iterations, args.buffer_mib), args.period_ms)
        else:
            burn(args.mode, args.buffer_mib)
    except BrokenPipeError:
        os._exit(0)


if __name__ == "__main__":
    main()
