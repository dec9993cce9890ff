"""The demo's phases in interleaved rounds: LS alone, LS + BE with kubelet's shares only, and with koordqos.

The LS probes are pinned to their own CPU(s) (`--ls-cpus`), the BE pod's streamers and the demo itself
(hence the agent it starts) to the others, so CFS shares cannot decide anything between LS and BE: what BE
takes from LS is the shared cache and memory bandwidth. The agent is started once, before anything is
measured, and given `warmup_seconds` (its start-up is never in a measured window); then every round runs
each phase once, in an order rotated by one each round. Outside its phase the agent is frozen (SIGSTOP) and
the besteffort quota is put back to unlimited, so the shares-only phase has no agent at all. Each phase
begins with `settle_seconds` that are not measured (BE starting, the agent's first rounds after it
resumes). Every `sample_interval` the runner reads the backend (CPU, quota, latency samples) and, while the
agent runs, its new CPU-suppress decisions, and hands everything to the view.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from koordqos.demo.agentproc import AgentProcess, AgentSpec, write_nodeslo
from koordqos.demo.nripods import demo_pods
from koordqos.demo.options import DemoOptions
from koordqos.demo.sampler import DecisionRow, PhaseFigures, Point, Recorder, window_key
from koordqos.demo.workload import BurnArgs, ProbeArgs, calibrate, split_cpus
from koordqos.testing.mock_nri.runtime import MockRuntime

STARTING = "agent-starting"
WARMUP = "agent-warm-up"
SETTLE = "settle"
FREEZE_TIMEOUT = 2.0  # how long a SIGSTOPped agent may take to stop
TICK_SECONDS = 0.05  # synthetic counters advance this often (the agent reads them every --interval)


@dataclass(frozen=True)
class Phase:
    """One phase of a round."""

    name: str
    title: str
    burners: bool
    agent: bool


ALONE = Phase("ls-alone", "LS alone", burners=False, agent=False)
SHARES_ONLY = Phase("shares-only", "LS + BE, kubelet shares only", burners=True, agent=False)
KOORDQOS = Phase("koordqos", "LS + BE, koordqos", burners=True, agent=True)
PHASES = (ALONE, SHARES_ONLY, KOORDQOS)


def round_order(rnd: int) -> list[Phase]:
    """The phases of round `rnd` (from 0): rotated by one each round, so none always follows another."""
    k = rnd % len(PHASES)
    return list(PHASES[k:] + PHASES[:k])


class Backend(Protocol):
    """Where the workload runs: the real kernel (`RealNode`) or a simulation (`SyntheticBackend`)."""

    kind: str
    cpus: int
    cpu_ids: list[int]

    @property
    def cgroup_version(self) -> str: ...
    def setup(self, ls_request_milli: int) -> None: ...
    def pin_demo(self, cpus: list[int]) -> None: ...
    async def start_probes(self, count: int, probe: ProbeArgs) -> None: ...
    async def start_burners(self, count: int, burn: BurnArgs) -> None: ...
    async def stop_burners(self) -> None: ...
    async def stop(self) -> None: ...
    async def tick(self) -> None: ...
    def drain_latencies(self) -> list[int]: ...
    def read(self) -> tuple[float, float, int]: ...
    def set_be_quota(self, quota: int) -> None: ...
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
    phases: list[PhaseFigures] = field(default_factory=list)  # one per phase and round, in run order
    ls_cpus: list[int] = field(default_factory=list)
    be_cpus: list[int] = field(default_factory=list)
    agent_startup_seconds: float | None = None
    agent_exit_code: int | None = None
    loadavg_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    loadavg_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    started_wall: float = 0.0
    scratch_name: str = ""
    scratch_removed: bool | None = None
    error: str = ""


class Runner:
    """Runs the rounds on a backend (see the module docstring)."""

    def __init__(self, opts: DemoOptions, backend: Backend, view: View, workdir: Path) -> None:
        self.opts = opts
        self.backend = backend
        self.view = view
        self.workdir = workdir
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.rec = Recorder()
        self.agent: AgentProcess | None = None
        self._agent_running = False
        self._burners_running = False
        self._ls_used: float | None = None
        self._last_metrics = 0.0
        self._step = 0
        self._burn = BurnArgs()

    def now(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.t0

    async def run(self, result: RunResult) -> None:
        """Warm-up and all rounds; fills `result` as it goes (also when interrupted)."""
        opts, backend = self.opts, self.backend
        result.recorder = self.rec
        result.started_wall = self.wall0
        result.loadavg_start = os.getloadavg()
        ls_cpus, own_cpus = split_cpus(backend.cpu_ids, opts.ls_cpus)
        pinned = ls_cpus != own_cpus
        result.ls_cpus, result.be_cpus = ls_cpus, own_cpus
        backend.setup(opts.ls_request_milli)
        if pinned:
            backend.pin_demo(own_cpus)  # the agent, started by us, runs there too
        if backend.kind == "real":
            self.view.note(f"calibrating the probes' {opts.probe_mode} work …")
            result.iterations = await asyncio.to_thread(
                calibrate, opts.work_ms, opts.probe_mode, opts.buffer_mib, 15, opts.period_ms
            )
        probe = ProbeArgs(
            opts.probe_mode,
            max(1, result.iterations),
            opts.period_ms,
            opts.buffer_mib,
            tuple(ls_cpus) if pinned else (),
        )
        self._burn = BurnArgs(opts.be_mode, opts.be_buffer_mib, tuple(own_cpus) if pinned else ())
        spec = backend.agent_spec(opts.interval)
        spec.extra_args = (*spec.extra_args, *opts.agent_args)
        runtime = MockRuntime(spec.nri_socket, runtime_name="containerd")
        runtime.pods, runtime.containers = demo_pods(opts.ls_request_milli)
        ticker = asyncio.create_task(self._tick_forever()) if backend.kind == "synthetic" else None
        await runtime.start()
        try:
            await backend.start_probes(opts.probes, probe)
            self._sample(STARTING)  # the first reading: rates start here
            await self._set_burners(True)
            result.agent_startup_seconds = await self._start_agent(spec)
            self.view.note(f"agent warm-up: {opts.warmup_seconds:g} s, not measured")
            await self._sample_for(WARMUP, opts.warmup_seconds)
            await self._pause_agent()
            for rnd in range(opts.rounds):
                for phase in round_order(rnd):
                    result.phases.append(await self._phase(phase, rnd))
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

    async def _phase(self, phase: Phase, rnd: int) -> PhaseFigures:
        opts = self.opts
        await self._set_burners(phase.burners)
        if phase.agent and self.agent is not None:
            self.agent.resume()
            self._agent_running = True
        total = opts.rounds * len(PHASES)
        shown = dataclasses.replace(phase, title=f"{phase.title} (round {rnd + 1}/{opts.rounds})")
        self.view.phase(shown, self._step, total, opts.phase_seconds)
        self._step += 1
        await self._sample_for(SETTLE, opts.settle_seconds)
        agent_cpu0 = self.agent.cpu_seconds() if phase.agent and self.agent is not None else None
        load = os.getloadavg()[0]
        start = self.now()
        await self._sample_for(phase.name, opts.phase_seconds, window_key(phase.name, rnd))
        end = self.now()
        agent_cpu = None
        if agent_cpu0 is not None and self.agent is not None:
            agent_cpu = self.agent.cpu_seconds() - agent_cpu0
        if phase.agent:
            await self._pause_agent()
        return self.rec.phase_figures(phase.name, phase.title, start, end, agent_cpu, rnd, load)

    async def _set_burners(self, on: bool) -> None:
        if on and not self._burners_running:
            await self.backend.start_burners(self.opts.burners, self._burn)
        elif not on and self._burners_running:
            await self.backend.stop_burners()
        self._burners_running = on

    async def _pause_agent(self) -> None:
        """Freeze the agent and, once it is stopped (no write of its can land after ours), put the quota
        back to what kubelet leaves (unlimited)."""
        if self.agent is not None:
            self.agent.pause()
            proc = self.agent.proc
            deadline = time.monotonic() + FREEZE_TIMEOUT
            while proc is not None and not _stopped(proc.pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        self._agent_running = False
        self.backend.set_be_quota(-1)

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
        self._agent_running = True
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

    async def _sample_for(self, phase: str, seconds: float, key: str = "") -> None:
        start = self.now()
        next_at = start
        elapsed = 0.0
        while elapsed < seconds:
            next_at += self.opts.sample_interval
            await asyncio.sleep(max(0.0, next_at - self.now()))
            elapsed = self.now() - start
            await self._sample_async(phase, min(1.0, elapsed / seconds), key)

    async def _sample_async(self, phase: str, progress: float, key: str = "") -> None:
        point = self._sample(phase, key)
        if self.agent is not None and self._agent_running:
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

    def _sample(self, phase: str, key: str = "") -> Point | None:
        """A reading labelled `phase`; latency samples count for the measured window `key` (none: they
        are dropped, as in settling and warm-up)."""
        self.rec.add_latencies(key, self.backend.drain_latencies())
        ls, be, quota = self.backend.read()
        return self.rec.add_point(self.now(), phase, ls, be, quota)


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped (or gone): /proc/<pid>/stat state T."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t", "Z", "X")
