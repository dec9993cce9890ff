"""Slow-step detector: how long each event-loop step runs and which one ran longest (opt-in).

The loop's budget is no step over 5 ms (docs/performance.md); the loop-lag probe only says that *some*
step was late. With `KOORDQOS_LOOP_WATCH=1` the agent times every step instead:

* on the stdlib loop, `asyncio.events.Handle._run` (every callback and every task step goes through it) is
  wrapped: the duration goes into a fixed-bucket histogram and a step over `slow_seconds` is remembered with
  its name (the task's name and coroutine and where it was suspended after the step, i.e. the `await` that
  ended the long stretch; or the callback's qualified name);
* `KOORDQOS_LOOP_WATCH=cpu` times steps by the loop thread's CPU time instead of the wall clock: on a loaded
  machine a step's wall time includes the time the thread waited for a core, its CPU time is the step's own
  work (the wall time of slow steps is kept too). It costs more (`thread_time` is a system call, ~1–2 µs);
* on a loop that does not run `Handle._run` (uvloop's handles are compiled), a probe timer re-armed every
  `probe_seconds` measures how late it fires: a step of L ms delays it by up to L ms, so the longest lateness
  bounds the longest step, without a name.

Off (the default) nothing is installed and nothing costs. On, a step costs ~1 µs more (two clock reads and a
bucket increment); names are only built for slow steps. Exposed as `koordqos_loop_step_seconds` and
`koordqos_loop_longest_step_seconds{step}` on /metrics and as JSON on /debug/loop.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from koordqos import observability as obs

ENV = "KOORDQOS_LOOP_WATCH"  # "1"/"true"/"on": wall clock; "cpu": the loop thread's CPU time
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
SLOW_SECONDS = 0.001  # steps at least this long are remembered by name (a few per second at most)
KEEP_SLOW = 512


@dataclass(frozen=True, slots=True)
class SlowStep:
    """One step over the slow threshold: when it ended (time.monotonic, shared by processes), how long."""

    at: float
    seconds: float
    name: str
    wall: float  # the same step by the wall clock (= seconds unless the clock is "cpu")


class LoopWatch:
    """Step durations of one loop; `record` is the only call on the hot path."""

    def __init__(self, mode: str, slow_seconds: float = SLOW_SECONDS, clock: str = "wall") -> None:
        self.mode = mode  # "handle" (every step timed) or "probe" (lateness of a timer)
        self.clock = clock  # "wall" or "cpu" (the loop thread's CPU time)
        self.slow_seconds = slow_seconds
        self.counts = [0] * (len(BUCKETS) + 1)
        self.steps = 0
        self.total = 0.0
        self.longest = 0.0
        self.longest_name = ""
        self.longest_at = 0.0
        self.slow: deque[SlowStep] = deque(maxlen=KEEP_SLOW)

    def record(self, seconds: float, what: Any, wall: float | None = None) -> None:
        """Count one step; remember it by name when slow."""
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.steps += 1
        self.total += seconds
        if seconds >= self.slow_seconds:
            now = time.monotonic()
            name = step_name(what)
            self.slow.append(SlowStep(now, seconds, name, seconds if wall is None else wall))
            if seconds > self.longest:
                self.longest, self.longest_name, self.longest_at = seconds, name, now

    def snapshot(self, since: float = 0.0) -> dict[str, Any]:
        """JSON for /debug/loop: totals, the longest step, the slow steps that ended at or after `since`."""
        slow = [s for s in self.slow if s.at >= since]
        top = max(slow, key=lambda s: s.seconds, default=None)
        return {
            "mode": self.mode,
            "clock": self.clock,
            "steps": self.steps,
            "seconds": round(self.total, 6),
            "buckets": dict(zip([*map(str, BUCKETS), "+Inf"], self.counts, strict=True)),
            "longest": {"seconds": self.longest, "name": self.longest_name, "at": self.longest_at},
            "longest_since": None
            if top is None
            else {"seconds": top.seconds, "name": top.name, "at": top.at, "wall": top.wall},
            "slow": [{"at": s.at, "seconds": s.seconds, "name": s.name, "wall": s.wall} for s in slow],
        }


def step_name(what: Any) -> str:
    """A readable name for a loop step: the task and where it stopped, or the callback."""
    if isinstance(what, str):
        return what
    cb = getattr(what, "_callback", what)
    task = getattr(cb, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        where = _suspended_at(coro)
        qual = getattr(coro, "__qualname__", type(coro).__name__)
        return f"task {task.get_name()} {qual}" + (f" → {where}" if where else "")
    func = getattr(cb, "__func__", cb)
    return f"callback {getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def _suspended_at(coro: Any) -> str:
    """Where the step ended: the innermost frame of the await chain outside asyncio, as qualname:line."""
    owner = coro
    last = ""
    for _ in range(64):  # await chains are short; bounded anyway
        frame = getattr(owner, "cr_frame", None) or getattr(owner, "gi_frame", None)
        if frame is None:
            break
        if not frame.f_code.co_filename.startswith(_ASYNCIO_DIR) or not last:
            last = f"{frame.f_code.co_qualname}:{frame.f_lineno}"
        owner = getattr(owner, "cr_await", None) or getattr(owner, "gi_yieldfrom", None)
        if owner is None:
            break
    return last


_ASYNCIO_DIR = os.path.dirname(asyncio.__file__)


class _Exposition(Collector):
    def __init__(self, watch: LoopWatch) -> None:
        self.watch = watch

    def collect(self) -> Iterator[Any]:
        w = self.watch
        cumulative, buckets = 0, []
        for le, n in zip([*map(str, BUCKETS), "+Inf"], w.counts, strict=True):
            cumulative += n
            buckets.append((le, cumulative))
        h = HistogramMetricFamily(
            "koordqos_loop_step_seconds",
            f"Duration of event-loop steps (mode {w.mode}; {ENV}=1)",
            buckets=buckets,
            sum_value=w.total,
        )
        yield h
        g = GaugeMetricFamily(
            "koordqos_loop_longest_step_seconds", "The longest event-loop step so far", labels=["step"]
        )
        g.add_metric([w.longest_name], w.longest)
        yield g


_installed: LoopWatch | None = None


def current() -> LoopWatch | None:
    """The installed watch (None when off)."""
    return _installed


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """`KOORDQOS_LOOP_WATCH` set to 1/true/yes/on or cpu."""
    return _setting(env) in ("1", "true", "yes", "on", "cpu")


def _setting(env: Mapping[str, str] | None) -> str:
    return (env if env is not None else os.environ).get(ENV, "").lower()


def install(
    loop: asyncio.AbstractEventLoop, probe_seconds: float = 0.005, env: Mapping[str, str] | None = None
) -> LoopWatch:
    """Time every step of `loop` (stdlib loop) or probe it (other loops); once per process."""
    global _installed
    if _installed is not None:
        return _installed
    if isinstance(loop, asyncio.BaseEventLoop):
        cpu = _setting(env) == "cpu"
        watch = LoopWatch("handle", clock="cpu" if cpu else "wall")
        (_wrap_handle_run_cpu if cpu else _wrap_handle_run)(watch)
    else:
        watch = LoopWatch("probe")
        _start_probe(loop, watch, probe_seconds)
    obs.REGISTRY.register(_Exposition(watch))
    _installed = watch
    return watch


def _wrap_handle_run(watch: LoopWatch) -> None:
    original = asyncio.events.Handle._run
    clock = time.perf_counter
    record = watch.record

    def _run(self: asyncio.Handle) -> None:
        start = clock()
        original(self)  # Handle._run catches and reports the callback's errors itself
        record(clock() - start, self)

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]


def _wrap_handle_run_cpu(watch: LoopWatch) -> None:
    original = asyncio.events.Handle._run
    clock, cpu_clock = time.perf_counter, time.thread_time
    record = watch.record

    def _run(self: asyncio.Handle) -> None:
        start, cpu_start = clock(), cpu_clock()
        original(self)
        record(cpu_clock() - cpu_start, self, clock() - start)

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]


def _start_probe(loop: asyncio.AbstractEventLoop, watch: LoopWatch, interval: float) -> None:
    name = f"? (probe timer on {type(loop).__module__}.{type(loop).__name__}: lateness, not a step name)"

    def fire(due: float) -> None:
        now = loop.time()
        watch.record(max(0.0, now - due), name)
        loop.call_at(now + interval, fire, now + interval)

    loop.call_at(loop.time() + interval, fire, loop.time() + interval)


__all__ = ["ENV", "LoopWatch", "SlowStep", "current", "enabled", "install", "step_name"]
