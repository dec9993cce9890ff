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

* garbage collections are timed too (`gc.callbacks`, the same clock): per generation how many ran and how long
  they took in all and at most, and every full (generation 2) collection and every one of at least
  `slow_seconds` with its time; a slow step says how much of it was collection (`gc`). A collection runs
  in whichever thread allocated when a threshold was crossed, and holds the GIL: the loop waits either way.

* `KOORDQOS_LOOP_WATCH=cpu,stacks` (or `wall,stacks`) also says *where* a long step spent its time: a
  sampler thread looks at the loop thread's Python stack every `SAMPLE_SECONDS` while a step runs past half
  the slow threshold, and a slow step keeps its most frequent stacks (`stacks`: innermost frame first). It
  lowers the interpreter's switch interval so the sampler gets the GIL during a long step: a diagnosis mode,
  it perturbs what it measures.

Off (the default) nothing is installed and nothing costs. On, a step costs ~1 µs more (two clock reads and a
bucket increment); names are only built for slow steps. Exposed as `koordqos_loop_step_seconds`,
`koordqos_loop_longest_step_seconds{step}` and `koordqos_loop_gc_seconds{generation}` on /metrics and as
JSON on /debug/loop.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from koordqos import observability as obs

ENV = "KOORDQOS_LOOP_WATCH"  # "1"/"on"/"wall": wall clock; "cpu": loop-thread CPU time; ",stacks": sample
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
SLOW_SECONDS = 0.001  # steps at least this long are remembered by name (a few per second at most)
KEEP_SLOW = 16384  # a 20 s bench window at 1,000 pods has ~1,000 steps over 1 ms (512 lost its start)
SAMPLE_SECONDS = 0.0005  # stacks mode: how often the sampler looks at the loop thread during a long step
STACK_DEPTH = 8  # frames kept per sample, innermost first
TOP_STACKS = 3  # stacks kept per slow step


@dataclass(frozen=True, slots=True)
class SlowStep:
    """One step over the slow threshold: when it ended (time.monotonic, shared by processes), how long."""

    at: float
    seconds: float
    name: str
    wall: float  # the same step by the wall clock (= seconds unless the clock is "cpu")
    gc: float = 0.0  # garbage collection inside the step (by the watch's clock)
    stacks: tuple[tuple[str, int], ...] = ()  # stacks mode: (stack, samples), most frequent first


@dataclass(frozen=True, slots=True)
class GcPause:
    """One garbage collection: when it ended (time.monotonic), its generation, how long it held the GIL."""

    at: float
    generation: int
    seconds: float
    collected: int


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
        # garbage collections, per generation: how many, their total and longest duration
        self.gc_counts = [0, 0, 0]
        self.gc_seconds = [0.0, 0.0, 0.0]
        self.gc_longest = [0.0, 0.0, 0.0]
        self.gc_total = 0.0  # all generations: a step's share is the difference across it
        self.gc_slow: deque[GcPause] = deque(maxlen=KEEP_SLOW)  # full ones and those ≥ slow_seconds
        # stacks mode: the running step's start (perf_counter; 0 between steps) and the sampler's findings
        self.step_start = 0.0
        self.samples: deque[tuple[float, str]] = deque(maxlen=8192)  # (step start, stack)

    def record(
        self,
        seconds: float,
        what: Any,
        wall: float | None = None,
        gc_before: float = -1.0,
        started: float = 0.0,
    ) -> None:
        """Count one step; remember it by name when slow (`gc_before`: `gc_total` when the step began;
        `started`: its start, by which the sampler's stacks of it are found)."""
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.steps += 1
        self.total += seconds
        if seconds >= self.slow_seconds:
            now = time.monotonic()
            name = step_name(what)
            in_gc = self.gc_total - gc_before if gc_before >= 0 else 0.0
            stacks: tuple[tuple[str, int], ...] = ()
            if started and self.samples:
                mine = Counter(stack for at, stack in list(self.samples) if at == started)
                stacks = tuple(mine.most_common(TOP_STACKS))
            self.slow.append(SlowStep(now, seconds, name, seconds if wall is None else wall, in_gc, stacks))
            if seconds > self.longest:
                self.longest, self.longest_name, self.longest_at = seconds, name, now

    def record_gc(self, generation: int, seconds: float, collected: int) -> None:
        """Count one garbage collection (from the gc callback); remember full and slow ones."""
        self.gc_counts[generation] += 1
        self.gc_seconds[generation] += seconds
        self.gc_total += seconds
        self.gc_longest[generation] = max(self.gc_longest[generation], seconds)
        if generation == 2 or seconds >= self.slow_seconds:
            self.gc_slow.append(GcPause(time.monotonic(), generation, seconds, collected))

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
            "slow": [
                {"at": s.at, "seconds": s.seconds, "name": s.name, "wall": s.wall, "gc": s.gc}
                | ({"stacks": [list(x) for x in s.stacks]} if s.stacks else {})
                for s in slow
            ],
            "gc": {
                str(g): {
                    "count": self.gc_counts[g],
                    "seconds": self.gc_seconds[g],
                    "longest": self.gc_longest[g],
                }
                for g in range(3)
            },
            "gc_slow": [
                {"at": p.at, "generation": p.generation, "seconds": p.seconds, "collected": p.collected}
                for p in self.gc_slow
                if p.at >= since
            ],
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
        c = CounterMetricFamily(
            "koordqos_loop_gc_seconds",
            f"Time spent in garbage collections, by generation ({w.clock} clock)",
            labels=["generation"],
        )
        k = CounterMetricFamily(
            "koordqos_loop_gc_collections", "Garbage collections, by generation", labels=["generation"]
        )
        for gen in range(3):
            c.add_metric([str(gen)], w.gc_seconds[gen])
            k.add_metric([str(gen)], w.gc_counts[gen])
        yield c
        yield k


_installed: LoopWatch | None = None


def current() -> LoopWatch | None:
    """The installed watch (None when off)."""
    return _installed


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """`KOORDQOS_LOOP_WATCH` set to 1/true/yes/on/wall or cpu (optionally with `,stacks`)."""
    return bool(_setting(env) & {"1", "true", "yes", "on", "wall", "cpu"})


def _setting(env: Mapping[str, str] | None) -> set[str]:
    value = (env if env is not None else os.environ).get(ENV, "").lower()
    return {part.strip() for part in value.split(",")}


def install(
    loop: asyncio.AbstractEventLoop, probe_seconds: float = 0.005, env: Mapping[str, str] | None = None
) -> LoopWatch:
    """Time every step of `loop` (stdlib loop) or probe it (other loops); once per process."""
    global _installed
    if _installed is not None:
        return _installed
    if isinstance(loop, asyncio.BaseEventLoop):
        setting = _setting(env)
        cpu = "cpu" in setting
        watch = LoopWatch("handle", clock="cpu" if cpu else "wall")
        if "stacks" in setting:
            _wrap_handle_run_sampled(watch, cpu)
            _start_sampler(watch, threading.get_ident())
        else:
            (_wrap_handle_run_cpu if cpu else _wrap_handle_run)(watch)
    else:
        watch = LoopWatch("probe")
        _start_probe(loop, watch, probe_seconds)
    _watch_gc(watch)
    obs.REGISTRY.register(_Exposition(watch))
    _installed = watch
    return watch


def _wrap_handle_run(watch: LoopWatch) -> None:
    original = asyncio.events.Handle._run
    clock = time.perf_counter
    record = watch.record

    def _run(self: asyncio.Handle) -> None:
        gc_before = watch.gc_total
        start = clock()
        original(self)  # Handle._run catches and reports the callback's errors itself
        record(clock() - start, self, None, gc_before)

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]


def _wrap_handle_run_cpu(watch: LoopWatch) -> None:
    original = asyncio.events.Handle._run
    clock, cpu_clock = time.perf_counter, time.thread_time
    record = watch.record

    def _run(self: asyncio.Handle) -> None:
        gc_before = watch.gc_total
        start, cpu_start = clock(), cpu_clock()
        original(self)
        record(cpu_clock() - cpu_start, self, clock() - start, gc_before)

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]


def _wrap_handle_run_sampled(watch: LoopWatch, cpu: bool) -> None:
    original = asyncio.events.Handle._run
    clock = time.perf_counter
    cpu_clock = time.thread_time if cpu else time.perf_counter
    record = watch.record

    def _run(self: asyncio.Handle) -> None:
        gc_before = watch.gc_total
        start, cpu_start = clock(), cpu_clock()
        watch.step_start = start
        original(self)
        watch.step_start = 0.0
        record(cpu_clock() - cpu_start, self, clock() - start, gc_before, start)

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]


def _start_sampler(watch: LoopWatch, loop_thread: int) -> None:
    """A daemon thread sampling the loop thread's stack while a step runs long (stacks mode)."""
    sys.setswitchinterval(SAMPLE_SECONDS)  # else a long step keeps the GIL for 5 ms at a time
    clock = time.perf_counter
    half = watch.slow_seconds / 2

    def sample() -> None:
        while True:
            time.sleep(SAMPLE_SECONDS)
            start = watch.step_start
            if not start or clock() - start < half:
                continue
            frame = sys._current_frames().get(loop_thread)
            if frame is not None and watch.step_start == start:
                watch.samples.append((start, _stack(frame)))

    threading.Thread(target=sample, name="loopwatch-sampler", daemon=True).start()


def _stack(frame: Any) -> str:
    """The innermost STACK_DEPTH frames below asyncio's, as `qualname:line < caller:line < …`."""
    parts: list[str] = []
    f = frame
    while f is not None and len(parts) < STACK_DEPTH:
        code = f.f_code
        if code.co_filename.startswith(_ASYNCIO_DIR) and parts:
            break  # the step's own frames end where asyncio's begin
        parts.append(f"{code.co_qualname}:{f.f_lineno}")
        f = f.f_back
    return " < ".join(parts)


def _watch_gc(watch: LoopWatch) -> None:
    """Time every garbage collection by the watch's clock (the callback runs in the collecting thread)."""
    clock = time.thread_time if watch.clock == "cpu" else time.perf_counter
    started = [0.0]  # collections never overlap (the collector holds the GIL and does not re-enter)

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = clock()
        else:
            watch.record_gc(info["generation"], clock() - started[0], info["collected"])

    gc.callbacks.append(on_gc)


def _start_probe(loop: asyncio.AbstractEventLoop, watch: LoopWatch, interval: float) -> None:
    name = f"? (probe timer on {type(loop).__module__}.{type(loop).__name__}: lateness, not a step name)"

    def fire(due: float) -> None:
        now = loop.time()
        watch.record(max(0.0, now - due), name)
        loop.call_at(now + interval, fire, now + interval)

    loop.call_at(loop.time() + interval, fire, loop.time() + interval)


__all__ = ["ENV", "GcPause", "LoopWatch", "SlowStep", "current", "enabled", "install", "step_name"]
