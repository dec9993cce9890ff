"""What a wake-up costs here: NRI CreateContainer (six hooks) in process, plugin-side p50/p99, with a pause
of a given kind between two calls.

The plugin is bench/hooks.py's `InProcessPlugin` (no socket: the request's bytes fed to its connection), so
the only difference between the rows is what happens between two calls:
* `back to back`: nothing;
* `syscalls`: four send/recv round trips on a socketpair (kernel entries, as a socket read and write);
* `caches`: 8 MiB of memory written (the caches evicted);
* `sleep`: `time.sleep(--sleep-us)`: the thread sleeps and the CPU goes idle, as the agent's does between
  two NRI calls that come further apart than its busy-poll window;
* `sleep, CPUs kept busy`: the same with one `SCHED_IDLE` spinner per CPU (it runs only when nothing else
  wants the CPU, and gives it up at once), so the CPU never goes idle.
On bare metal or a VM that polls before it halts the `sleep` rows are close to `back to back`; on a VM whose
idle vCPUs halt at once (`haltpoll.guest_halt_poll_ns=0`) the code after a wake-up runs far slower, which is
what the plugin-side figures of bench/hooks.py and bench/nri.py (a runtime in another process) pay. The
machine's idle settings are printed with the figures.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from _common import idle_spinners, machine, median, parser, percentile, quiet_logs, run, table
from hooks import InProcessPlugin


def pauses(sleep_us: int) -> dict[str, Callable[[], None]]:
    """The pauses between two calls, by row name."""
    a, b = socket.socketpair()
    junk = bytearray(8 << 20)

    def syscalls() -> None:
        for _ in range(4):
            a.send(b"x")
            b.recv(1)

    def caches() -> None:
        for i in range(0, len(junk), 64):
            junk[i] = 1

    return {
        "back to back": lambda: None,
        "syscalls": syscalls,
        "caches": caches,
        "sleep": lambda: time.sleep(sleep_us / 1e6),
    }


async def one_run(calls: int, pause: Callable[[], None]) -> tuple[float, float]:
    """Plugin-side p50 / p99 (µs) of `calls` CreateContainer with `pause()` before each (the first 10 %
    warm up)."""
    with InProcessPlugin() as ip:
        payloads = await ip.synchronize(200, 2)
        for i in range(calls):
            pause()
            await ip.call("CreateContainer", payloads[i % 16])
        times = ip.plugin.timings["CreateContainer"][calls // 10 :]
    return percentile(times, 50) * 1e6, percentile(times, 99) * 1e6


def idle_settings() -> str:
    """The machine's cpuidle driver / governor and any haltpoll setting on the kernel command line."""
    base = Path("/sys/devices/system/cpu/cpuidle")
    parts = []
    for name in ("current_driver", "current_governor_ro", "current_governor"):
        try:
            parts.append(f"{name}={(base / name).read_text().strip()}")
        except OSError:
            continue
    try:
        parts += [w for w in Path("/proc/cmdline").read_text().split() if "haltpoll" in w or "idle=" in w]
    except OSError:
        pass
    return ", ".join(parts) or "no cpuidle information"


def main() -> None:
    """Parse flags and print the table."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--sleep-us", type=int, default=200, help="the sleep between two calls (µs)")
    args = p.parse_args()
    quiet_logs()
    calls = 300 if args.quick else args.calls
    runs = 1 if args.quick else args.runs
    rows = []
    kinds = pauses(args.sleep_us)
    for name, pause in kinds.items():
        rows.append([name, [run(one_run(calls, pause), args.loop) for _ in range(runs)]])
    with idle_spinners():
        sleep = kinds["sleep"]
        rows.append(["sleep, CPUs kept busy", [run(one_run(calls, sleep), args.loop) for _ in range(runs)]])
    print(
        f"Wake-up cost — {machine()}; {calls} CreateContainer calls in process, six hooks, sleep "
        f"{args.sleep_us} µs, median of {runs} run(s), {args.loop} loop; {idle_settings()}; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print(
        table(
            [
                [
                    name,
                    f"{median([r[0] for r in res]):.0f} / {median([r[1] for r in res]):.0f} µs",
                    ", ".join(f"{a:.0f}/{b:.0f}" for a, b in res),
                ]
                for name, res in rows
            ],
            ["between two calls", "plugin-side p50 / p99", "per run"],
        )
    )


if __name__ == "__main__":
    main()
