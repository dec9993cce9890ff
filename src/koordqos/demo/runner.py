"""The demo's phases: LS alone → LS + BE without the agent → LS + BE with the agent.

The probes run throughout; the burners join in the second phase; the agent starts after it and the third
phase begins once it is ready (the start-up is recorded as its own stretch, "agent-starting"). Every
`sample_interval` the runner reads the backend (CPU, quota, latency samples) and, while the agent runs, its
new CPU-suppress decisions, and hands everything to the view.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from koordqos.demo.agentproc import AgentProcess, AgentSpec, write_nodeslo
from koordqos.demo.nripods import demo_pods
from koordqos.demo.options import DemoOptions
from koordqos.demo.sampler import DecisionRow, PhaseFigures, Point, Recorder
from koordqos.demo.workload import calibrate
from koordqos.testing.mock_nri.runtime import MockRuntime

STARTING = "agent-starting"
TICK_SECONDS = 0.05  # synthetic counters advance this often (the agent reads them every --interval)


@dataclass(frozen=True)
class Phase:
    """One phase of the run."""

    name: str
    title: str
    burners: bool
    agent: bool


PHASES = (
    Phase("ls-alone", "LS alone", burners=False, agent=False),
    Phase("be-no-agent", "LS + BE, no agent", burners=True, agent=False),
    Phase("be-agent", "LS + BE, agent on", burners=True, agent=True),
)


class Backend(Protocol):
    """Where the workload runs: the real kernel (`RealNode`) or a simulation (`SyntheticBackend`)."""

    kind: str
    cpus: int

    @property
    def cgroup_version(self) -> str: ...
    def setup(self, ls_request_milli: int) -> None: ...
    async def start_probes(self, count: int, iterations: int, period_ms: float) -> None: ...
    async def start_burners(self, count: int) -> None: ...
    async def stop(self) -> None: ...
    async def tick(self) -> None: ...
    def drain_latencies(self) -> list[int]: ...
    def read(self) -> tuple[float, float, int]: ...
    def agent_spec(self, interval: float) -> AgentSpec: ...
    def scratch_left(self) -> bool: ...


class View(Protocol):
    """What the runner tells the user (live view or plain lines)."""

    def phase(self, phase: Phase, index: int, total: int, seconds: float) -> None: ...
    def point(self, point: Point, progress: float, ls_used: float | None) -> None: ...
    def decision(self, row: DecisionRow) -> None: ...
    def note(self, text: str) -> None: ...


@dataclass
class RunResult:
    """Everything a run produced (the report is made from it)."""

    options: DemoOptions
    mode: str
    cgroup_version: str
    cpus: int
    iterations: int
    recorder: Recorder = field(default_factory=Recorder)
    phases: list[PhaseFigures] = field(default_factory=list)
    agent_startup_seconds: float | None = None
    agent_exit_code: int | None = None
    loadavg_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    loadavg_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    started_wall: float = 0.0
    scratch_name: str = ""
    scratch_removed: bool | None = None
    error: str = ""


class Runner:
    """Runs the phases on a backend (see the module docstring)."""

    def __init__(self, opts: DemoOptions, backend: Backend, view: View, workdir: Path) -> None:
        self.opts = opts
        self.backend = backend
        self.view = view
        self.workdir = workdir
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.rec = Recorder()
        self.agent: AgentProcess | None = None
        self._ls_used: float | None = None
        self._last_metrics = 0.0

    def now(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.t0

    async def run(self, result: RunResult) -> None:
        """All phases; fills `result` as it goes (also when interrupted)."""
        opts, backend = self.opts, self.backend
        result.recorder = self.rec
        result.started_wall = self.wall0
        result.loadavg_start = os.getloadavg()
        backend.setup(opts.ls_request_milli)
        if backend.kind == "real":
            self.view.note("calibrating the probes' work …")
            result.iterations = await asyncio.to_thread(calibrate, opts.work_ms)
        spec = backend.agent_spec(opts.interval)
        spec.extra_args = (*spec.extra_args, *opts.agent_args)
        runtime = MockRuntime(spec.nri_socket, runtime_name="containerd")
        runtime.pods, runtime.containers = demo_pods(opts.ls_request_milli)
        ticker = asyncio.create_task(self._tick_forever()) if backend.kind == "synthetic" else None
        await runtime.start()
        try:
            await backend.start_probes(opts.probes, result.iterations, opts.period_ms)
            self._sample(PHASES[0].name)  # the first reading: rates start here
            for index, phase in enumerate(PHASES):
                if phase.burners and index and not PHASES[index - 1].burners:
                    await backend.start_burners(opts.burners)
                agent_cpu0: float | None = None
                if phase.agent:
                    result.agent_startup_seconds = await self._start_agent(spec)
                    assert self.agent is not None
                    agent_cpu0 = self.agent.cpu_seconds()
                self.view.phase(phase, index, len(PHASES), opts.phase_seconds)
                start = self.now()
                await self._sample_for(phase.name, opts.phase_seconds)
                end = self.now()
                agent_cpu = None
                if agent_cpu0 is not None and self.agent is not None:
                    agent_cpu = self.agent.cpu_seconds() - agent_cpu0
                result.phases.append(self.rec.phase_figures(phase.name, phase.title, start, end, agent_cpu))
        finally:
            if self.agent is not None and self.agent.started:
                result.agent_exit_code = await self.agent.stop()
            await backend.stop()
            await runtime.stop()
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            result.loadavg_end = os.getloadavg()

    async def _tick_forever(self) -> None:
        while True:
            await self.backend.tick()
            await asyncio.sleep(TICK_SECONDS)

    async def _start_agent(self, spec: AgentSpec) -> float:
        write_nodeslo(spec.nodeslo_file, self.opts.threshold_percent)
        self.agent = AgentProcess(spec)
        log = self.opts.out / "agent.log"
        self.view.note(f"starting the agent (python -m koordqos run, local mode; its log: {log})")
        await self.agent.start()
        ready = asyncio.create_task(self.agent.wait_ready(self.opts.agent_ready_timeout))
        await self._sample_until(STARTING, ready)
        startup = ready.result()
        self.view.note(f"agent ready after {startup:.1f} s")
        return startup

    async def _sample_until(self, phase: str, done: Awaitable[object]) -> None:
        task = asyncio.ensure_future(done)
        while not task.done():
            await asyncio.wait({task}, timeout=self.opts.sample_interval)
            await self._sample_async(phase, 0.0)

    async def _sample_for(self, phase: str, seconds: float) -> None:
        start = self.now()
        next_at = start
        elapsed = 0.0
        while elapsed < seconds:
            next_at += self.opts.sample_interval
            await asyncio.sleep(max(0.0, next_at - self.now()))
            elapsed = self.now() - start
            await self._sample_async(phase, min(1.0, elapsed / seconds))

    async def _sample_async(self, phase: str, progress: float) -> None:
        point = self._sample(phase)
        if self.agent is not None:
            for d in await self.agent.new_decisions():
                row = DecisionRow(
                    t=round(d["time"] - self.wall0, 3),
                    action=str(d["action"]),
                    target=str(d["target"]),
                    old=str(d["old"]),
                    new=str(d["new"]),
                    reason=str(d["reason"]),
                )
                self.rec.add_decision(row)
                self.view.decision(row)
            if self.now() - self._last_metrics >= 1.0:
                self._last_metrics = self.now()
                self._ls_used = await self.agent.ls_used_cores()
        if point is not None:
            self.view.point(point, progress, self._ls_used)

    def _sample(self, phase: str) -> Point | None:
        self.rec.add_latencies(phase, self.backend.drain_latencies())
        ls, be, quota = self.backend.read()
        return self.rec.add_point(self.now(), phase, ls, be, quota)
