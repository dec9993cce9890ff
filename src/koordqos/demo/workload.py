"""The demo's workload processes: LS latency probes and BE CPU burners.

`python -m koordqos.demo.workload probe --iterations N --period-ms 2.5` runs a probe: every period it does a
fixed amount of CPU work (N loop iterations, calibrated to `--work-ms` on an idle CPU) and reports, per slot,
the time from the slot's *scheduled* start to the end of the work (so wake-up delay, preemption and
throttling all count, and a probe that falls behind is not excused: no coordinated omission). It prints one
line per report interval: `<monotonic end of interval> <latency µs> <latency µs> ...`.

`python -m koordqos.demo.workload burn` spins forever (a BE burner).

Both exit when their stdin closes or on SIGTERM, so no orphan outlives the demo.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

REPORT_SECONDS = 0.1
#: A probe more than this far behind its schedule restarts it (the slots it missed are counted as one).
MAX_BACKLOG_SECONDS = 0.1


def spin(iterations: int) -> int:
    """The probe's unit of CPU work."""
    acc = 0
    for i in range(iterations):
        acc ^= i
    return acc


def calibrate(work_ms: float, trials: int = 15) -> int:
    """Iterations of `spin` taking `work_ms` on an idle CPU (best of `trials`: preemption only adds time)."""
    probe = 20_000
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        spin(probe)
        best = min(best, time.perf_counter() - start)
    return max(1, round(probe * (work_ms / 1000) / best))


def _exit_when_stdin_closes() -> None:
    """The parent holds our stdin: when it goes away (even SIGKILLed), so do we."""

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(1):
                pass
        finally:
            os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def probe(iterations: int, period_ms: float) -> None:
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
        spin(iterations)
        end = time.monotonic()
        batch.append(str(round((end - scheduled) * 1e6)))
        if end >= report_at:
            out.write(f"{end:.6f} {' '.join(batch)}\n")
            out.flush()
            batch.clear()
            report_at = end + REPORT_SECONDS


def burn() -> None:
    """Spin forever."""
    while True:
        pass


def main(argv: list[str] | None = None) -> None:
    """Entry point of a workload process."""
    p = argparse.ArgumentParser(description="koordqos demo workload")
    sub = p.add_subparsers(dest="kind", required=True)
    pr = sub.add_parser("probe")
    pr.add_argument("--iterations", type=int, required=True)
    pr.add_argument("--period-ms", type=float, default=2.5)
    sub.add_parser("burn")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the demo, which stops us in order
    _exit_when_stdin_closes()
    try:
        if args.kind == "probe":
            probe(args.iterations, args.period_ms)
        else:
            burn()
    except BrokenPipeError:
        os._exit(0)


if __name__ == "__main__":
    main()
