"""Agent: builds every component from AgentConfig and runs them under one TaskGroup until stopped.

Components plug in through `setup(ctx)` functions, called in dependency order (cgroups before metrics,
metrics before strategies, …). Each returns the long-running components it wants supervised and may put
shared services (executor, metrics store, evictor) on the AgentContext for later packages.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from koordqos import observability as obs
from koordqos.config import AgentConfig
from koordqos.decisions import DecisionLog
from koordqos.events.bus import EventBus

log = structlog.get_logger("koordqos.agent")

READY_SOURCES = frozenset({"pods", "node", "nodeslo"})


class Component(Protocol):
    """A long-running part of the agent. `run` returns only when cancelled (or on a crash)."""

    name: str
    essential: bool

    async def run(self) -> None: ...


@dataclass
class FunctionComponent:
    """Adapts an async function to Component."""

    name: str
    func: Callable[[], Awaitable[None]]
    essential: bool = False

    async def run(self) -> None:
        """Run the wrapped function."""
        await self.func()


@dataclass
class AgentContext:
    """What packages share while the agent is built: config, bus, decision log and services."""

    config: AgentConfig
    bus: EventBus
    decisions: DecisionLog
    local_mode: bool
    services: dict[str, Any] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)  # shown by /readyz and /debug/state
    shutdown: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def on_shutdown(self, func: Callable[[], Awaitable[None]]) -> None:
        """Run `func` once after every component stopped (close clients, sockets), within the timeout."""
        self.shutdown.append(func)

    def service(self, name: str) -> Any:
        """A shared service put there by an earlier package (KeyError if absent)."""
        return self.services[name]


Setup = Callable[[AgentContext], Sequence[Component]]


def cluster_mode_available(cfg: AgentConfig, env: dict[str, str] | None = None) -> bool:
    """Whether a kubeconfig or an in-cluster service account is present."""
    import os

    env = dict(os.environ) if env is None else env
    if cfg.kube.kubeconfig:
        return True
    if env.get("KUBECONFIG"):
        return True
    if Path(env.get("HOME", "/nonexistent"), ".kube", "config").exists():
        return True
    return (
        bool(env.get("KUBERNETES_SERVICE_HOST"))
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    )


def default_setups() -> list[tuple[str, Setup]]:
    """The packages that contribute components, in dependency order."""
    from koordqos import cgroups, hooks, kube, metrics, nri, proxy, server, strategies

    return [
        ("cgroups", cgroups.setup),
        ("metrics", metrics.setup),
        ("kube", kube.setup),
        ("strategies", strategies.setup),
        ("hooks", hooks.setup),
        ("nri", nri.setup),
        ("proxy", proxy.setup),
        ("server", server.setup),
    ]


class Supervisor:
    """Runs components; restarts a crashed one with capped exponential backoff; counts crashes."""

    def __init__(self, base_delay: float = 0.5, max_delay: float = 30.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.crashes: dict[str, int] = {}

    async def supervise(self, comp: Component) -> None:
        """Run `comp` forever: a crash is logged, counted and followed by a restart after a backoff."""
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await comp.run()
                log.info("component returned", component=comp.name)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.crashes[comp.name] = self.crashes.get(comp.name, 0) + 1
                obs.COMPONENT_RESTARTS.labels(comp.name).inc()
                # a component that ran for a while before crashing starts its backoff afresh
                failures = 1 if time.monotonic() - started > 60 else failures + 1
                delay = min(self.max_delay, self.base_delay * 2 ** (failures - 1))
                delay *= 1 + random.uniform(-0.1, 0.1)
                log.error(
                    "component crashed; restarting",
                    component=comp.name,
                    essential=comp.essential,
                    attempt=failures,
                    retry_in_s=round(delay, 2),
                    error=f"{type(exc).__name__}: {exc}",
                    exc_info=exc,
                )
                await asyncio.sleep(delay)


class LoopLagMonitor:
    """Measures how late the loop wakes a 100 ms timer; exported as a histogram."""

    name = "loop-lag"
    essential = False

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.last_lag = 0.0

    async def run(self) -> None:
        """Probe forever."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            self.last_lag = max(0.0, loop.time() - start - self.interval)
            obs.LOOP_LAG.observe(self.last_lag)


class Agent:
    """The whole node agent."""

    def __init__(
        self,
        config: AgentConfig,
        setups: list[tuple[str, Setup]] | None = None,
        local_mode: bool | None = None,
    ) -> None:
        self.config = config
        self.bus = EventBus()
        self.decisions = DecisionLog(dry_run=config.dry_run)
        self.local_mode = (not cluster_mode_available(config)) if local_mode is None else local_mode
        self.ctx = AgentContext(config, self.bus, self.decisions, self.local_mode)
        self.ctx.services["agent"] = self
        self.supervisor = Supervisor()
        self.lag = LoopLagMonitor()
        self._setups = default_setups() if setups is None else setups
        self._stop = asyncio.Event()
        self.components: list[Component] = []

    def build(self) -> None:
        """Call every package's setup in order and collect its components."""
        # the first log line announces the mode (before any package logs during its setup)
        log.info(
            "koordqos starting",
            mode="local" if self.local_mode else "cluster",
            node=self.config.node_name,
            dry_run=self.config.dry_run,
        )
        comps: list[Component] = [FunctionComponent("bus", self.bus.run, essential=True), self.lag]
        for _name, setup in self._setups:
            comps.extend(setup(self.ctx))
        self.components = comps
        # Start-up leaves ~80k long-lived objects (imports, models); a full collection of them costs 50-90 ms
        # on the loop. Freezing them once keeps every later GC pass short (bench/watch.py --gc-freeze).
        gc.collect()
        gc.freeze()

    @property
    def ready(self) -> bool:
        """Pods, Node and NodeSLO sources have synced."""
        return self.bus.state.synced >= READY_SOURCES

    def stop(self) -> None:
        """Ask the agent to stop (safe from signal handlers)."""
        self._stop.set()

    async def _run_shutdown(self, timeout: float) -> None:
        """Run the shutdown callbacks (in reverse registration order); failures are logged, never raised."""
        try:
            async with asyncio.timeout(timeout):
                for func in reversed(self.ctx.shutdown):
                    try:
                        await func()
                    except Exception as exc:
                        log.warning(
                            "shutdown step failed",
                            step=getattr(func, "__qualname__", repr(func)),
                            error=f"{type(exc).__name__}: {exc}",
                        )
        except TimeoutError:
            log.error("shutdown steps did not finish in time", timeout_s=round(timeout, 2))

    async def run(self) -> None:
        """Run until `stop()` (or SIGTERM/SIGINT); stop every component within the shutdown timeout."""
        loop = asyncio.get_running_loop()
        if loop.get_debug():  # PYTHONASYNCIODEBUG=1: name every step that breaks the 10 ms budget
            loop.slow_callback_duration = 0.01
        if not self.components:
            self.build()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        log.info("components starting", components=[c.name for c in self.components])
        tasks: list[asyncio.Task[None]] = []
        try:
            async with asyncio.TaskGroup() as tg:
                for comp in self.components:
                    tasks.append(tg.create_task(self.supervisor.supervise(comp), name=comp.name))
                stopper = tg.create_task(self._stop.wait(), name="stop")
                await stopper
                log.info("stopping", timeout_s=self.config.shutdown_timeout_seconds)
                for t in tasks:
                    t.cancel()
                deadline = loop.time() + self.config.shutdown_timeout_seconds
                _done, pending = await asyncio.wait(tasks, timeout=self.config.shutdown_timeout_seconds)
                if pending:
                    log.error("components did not stop in time", components=[t.get_name() for t in pending])
                await self._run_shutdown(max(0.1, deadline - loop.time()))
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        log.info("koordqos stopped")
