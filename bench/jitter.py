"""The machine's own step jitter: a fixed unit of pure-Python work timed by the thread's CPU clock.

The slow-step detector of bench/agent.py times loop steps by the loop thread's CPU time (`--step-clock cpu`),
so that waiting for a core is left out. On some machines that clock still counts time the code did not
spend: interrupt handling charged to the running thread (no `CONFIG_IRQ_TIME_ACCOUNTING`), a vCPU held up by
its host without it being reported as steal. This bench runs one unit of work (≈ 60 µs here) in bursts
of 50 with a 1 ms sleep between bursts (the CPU idles, as the agent's does between ticks), for `--seconds`,
and reports how often one unit took more than 2 and 5 ms of CPU: a step of the agent that is 4–10 ms of
CPU once in a while, anywhere, may be this, not its code (docs/performance-history.md, session 30). The
kernel's accounting settings are printed with the figures when /proc/config.gz exists.

    python bench/jitter.py [--quick] [--runs N] [--seconds S]
"""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

from _common import machine, median, parser, table

DATA = list(range(600))
TABLE = {i: i for i in range(500)}
SETTINGS = ("CONFIG_IRQ_TIME_ACCOUNTING", "CONFIG_PARAVIRT_TIME_ACCOUNTING", "CONFIG_HZ=")


def unit() -> int:
    """The fixed work: 600 dict lookups and additions."""
    total = 0
    for x in DATA:
        total += TABLE.get(x % 500, 0)
    return total


def one_run(seconds: float) -> dict[str, float]:
    """Units done, their median CPU time (µs), how many took > 2 ms and > 5 ms, the longest (ms)."""
    clock = time.thread_time_ns
    took: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            start = clock()
            unit()
            took.append(clock() - start)
        time.sleep(0.001)
    took.sort()
    return {
        "units": len(took),
        "median_us": took[len(took) // 2] / 1e3,
        "over_2ms": sum(1 for t in took if t > 2_000_000),
        "over_5ms": sum(1 for t in took if t > 5_000_000),
        "longest_ms": took[-1] / 1e6,
    }


def kernel_settings() -> str:
    """The kernel's time-accounting settings, from /proc/config.gz (empty when it is not there)."""
    path = Path("/proc/config.gz")
    if not path.exists():
        return ""
    with gzip.open(path, "rt") as f:
        lines = [line.strip() for line in f if line.strip().lstrip("# ").startswith(SETTINGS)]
    return "; ".join(lines)


def main() -> None:
    """Run the bench and print the figures (median of runs)."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=30.0, help="length of one run")
    args = p.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    runs = [one_run(seconds) for _ in range(1 if args.quick else args.runs)]
    med = {k: median([r[k] for r in runs]) for k in runs[0]}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"Step jitter — {machine()}; {len(runs)} run(s) of {seconds:.0f} s; load average {load}")
    settings = kernel_settings()
    if settings:
        print(f"kernel: {settings}")
    per_run = "; ".join(f"{r['over_2ms']:.0f}/{r['over_5ms']:.0f}/{r['longest_ms']:.2f}" for r in runs)
    print(
        table(
            [
                ["units of work timed (median of runs)", f"{med['units']:,.0f}"],
                ["CPU time of one unit, median", f"{med['median_us']:.1f} µs"],
                ["units that took > 2 ms of CPU", f"{med['over_2ms']:.0f}"],
                ["units that took > 5 ms of CPU", f"{med['over_5ms']:.0f}"],
                ["the longest unit", f"{med['longest_ms']:.2f} ms"],
                ["per run: > 2 ms / > 5 ms / longest (ms)", per_run],
            ],
            ["measure", "value"],
        )
    )


if __name__ == "__main__":
    main()
