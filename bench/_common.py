"""Shared helpers for the benchmarks: percentiles, medians of runs, a small table printer."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

# the test tooling the benchmarks share with the tests (tests/support: not in the product wheel)
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from koordqos.config import NRISettings

T = TypeVar("T")

#: The six runtime hooks, all switched on by the hook benchmarks (NRI and proxy mode alike).
ALL_HOOK_GATES = (
    "BatchResource",
    "CPUNormalization",
    "CPUSetAllocator",
    "CoreSched",
    "GroupIdentity",
    "OOMScoreAdj",
)

#: A pod's `node.koordinator.sh/extended-resource-spec` for 16 BE containers `c0`…`c15` with batch resources.
BATCH_EXTENDED_RESOURCE_SPEC = json.dumps(
    {
        "containers": {
            f"c{j}": {
                "requests": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "2Gi"},
                "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"},
            }
            for j in range(16)
        }
    }
)


def quiet_logs() -> None:
    """Only errors from the agent's loggers: log lines would dominate what is measured."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100) by nearest rank."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: Sequence[float]) -> float:
    """Median of several runs."""
    return statistics.median(values)


def machine() -> str:
    """One line naming the machine and the build the figures come from."""
    from koordqos.build import describe

    cpu = platform.processor() or platform.machine()
    return f"{os.cpu_count()} CPUs, {cpu}, Python {platform.python_version()}, koordqos {describe()}"


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the common `--quick`, `--runs` and `--loop` options."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    p.add_argument("--runs", type=int, default=5, help="runs to take the median of")
    p.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="event loop of both processes (uvloop: a dependency of koordqos)",
    )
    return p


def run(coro: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """`asyncio.run(coro)` on the stdlib loop or on uvloop."""
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def two_process_parser(
    description: str, roles: tuple[str, ...], calls: int = 2000
) -> argparse.ArgumentParser:
    """`parser` plus `--role` (the measured side first; the other side runs in a child process), `--socket`,
    `--calls`."""
    p = parser(description)
    p.add_argument("--role", choices=list(roles), default=roles[0])
    p.add_argument("--socket", default="")
    p.add_argument("--calls", type=int, default=calls)
    return p


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Render rows as a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class LongestStep:
    """A probe task that yields in a loop and records the longest time another task held the loop.

    `longest` is wall time between two wake-ups of the probe (includes being descheduled on a loaded
    machine); `longest_cpu` is the loop thread's CPU time in the same gap (`time.thread_time`), which bounds
    the CPU of one synchronous step and does not grow with the load.
    """

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_cpu = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _spin(self) -> None:
        while True:
            t, c = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0)
            self.longest = max(self.longest, time.perf_counter() - t)
            self.longest_cpu = max(self.longest_cpu, time.thread_time() - c)

    def reset(self) -> None:
        """Forget what was seen so far (after a warm-up)."""
        self.longest = self.longest_cpu = 0.0

    def __enter__(self) -> LongestStep:
        self._task = asyncio.get_running_loop().create_task(self._spin())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


_SPINNER = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"


@contextmanager
def idle_spinners(enabled: bool = True) -> Iterator[None]:
    """One SCHED_IDLE busy loop per CPU for the duration (killed afterwards, also on failure): the CPUs never
    go idle, yet anything else that wants one gets it at once (bench/wakeup.py: what an idle CPU costs)."""
    n = (os.cpu_count() or 1) if enabled else 0
    procs = [subprocess.Popen([sys.executable, "-c", _SPINNER]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def add_busy_poll(p: argparse.ArgumentParser) -> None:
    """`--busy-poll SECONDS` for the NRI benchmarks: the measured plugin's window (see `plugin_settings`)."""
    p.add_argument(
        "--busy-poll",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the plugin's nri.busy_poll_seconds (default: the agent's default; 0: off)",
    )


def plugin_settings(sock: Path, busy_poll: float | None = None) -> NRISettings:
    """The measured NRI plugin's settings: the defaults on `sock`, with `busy_poll` when given."""
    return (
        NRISettings(socket=sock)
        if busy_poll is None
        else NRISettings(socket=sock, busy_poll_seconds=busy_poll)
    )


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
