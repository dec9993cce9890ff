"""Agent: the one composer. Builds the typed `Services` once, in a fixed order, then the components, and
runs them under one TaskGroup until stopped.

Packages never import this module: they expose classes and builders taking typed dependencies, and only
this module knows how they fit together. `Services` holds the shared, passive parts (no task, no
subscription); `Parts` holds the components, built for the packages an agent runs (all of them normally;
tests pick a few).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from koordqos import __version__, loopwatch
from koordqos import observability as obs
from koordqos.build import describe as describe_build
from koordqos.bus import EventBus
from koordqos.cgroups import CgroupExecutor, CgroupLayout, CgroupReader, CgroupVersion, describe
from koordqos.cgroups.roots import check_host_roots, missing_controllers, readiness_reason
from koordqos.component import Component, FunctionComponent, ShutdownStep
from koordqos.config import AgentConfig, parse_failure_policy
from koordqos.decisions import DecisionLog
from koordqos.errors import ConfigError, KubeError, StartupError
from koordqos.features import inert_gates
from koordqos.hooks import build_runtime_hooks
from koordqos.hooks.core import HookCore
from koordqos.hooks.reconcile_plan import CLUSTER_POD_SOURCES, LOCAL_POD_SOURCES
from koordqos.hooks.reconciler import HookReconciler
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.host import HostActuator, PrctlCookieOps
from koordqos.kube import KubeConnection, cluster_sources
from koordqos.kube.eventlimit import RateLimitedRecorder
from koordqos.kube.eventrecorder import EventRecorder
from koordqos.kube.evictor import Evictor
from koordqos.kube.kubeconfig import check_source, find_source
from koordqos.kube.nodemark import NodeMarker
from koordqos.kube.sources import NodeSLOSource
from koordqos.localsources import LocalSources
from koordqos.metrics.collector import ContainerDemand, MetricsCollector
from koordqos.metrics.psi import PSICollector
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import CpuTopology, read_topology
from koordqos.metrics.types import ContainerSeries
from koordqos.model.pod import PodInfo
from koordqos.nri import build_plugin
from koordqos.nri.convert import NRIHooks
from koordqos.nri.plugin import NRIPlugin
from koordqos.nri.session import no_hooks
from koordqos.process.eventloop import loop_factory
from koordqos.process.exitdeadline import EXIT_GRACE_SECONDS, ExitDeadline, cancel_until
from koordqos.process.gcpolicy import GcPolicy
from koordqos.process.looplag import LoopLagMonitor
from koordqos.process.supervisor import Supervisor
from koordqos.proxy import build_server
from koordqos.proxy.server import ProxyServer
from koordqos.report.build import Reporters, build_reporters
from koordqos.report.nrt import NRTDesired
from koordqos.server.http import HTTPServer
from koordqos.state import NodeState
from koordqos.strategies import build_qos_manager
from koordqos.strategies.cpuburst import CPUBurstStrategy
from koordqos.strategies.cpuburst_plan import reads_container_cpu
from koordqos.strategies.framework import QoSManager
from koordqos.syncgate import AfterSync, SyncGate

log = structlog.get_logger("koordqos.agent")

READY_SOURCES = frozenset({"pods", "node", "nodeslo"})

# the packages that contribute components, in the order their components are built
PACKAGES = ("metrics", "kube", "strategies", "hooks", "report", "nri", "proxy", "server")

__all__ = [
    "PACKAGES",
    "Agent",
    "Component",
    "FunctionComponent",
    "Parts",
    "Services",
    "build_services",
    "loop_factory",
]


@dataclass(frozen=True)
class Services:
    """The agent's shared, passive dependencies, built once by `build_services` in field order."""

    config: AgentConfig
    local_mode: bool
    bus: EventBus
    decisions: DecisionLog
    status: dict[str, Any]  # shown by /readyz and /debug/state
    layout: CgroupLayout
    executor: CgroupExecutor
    host: HostActuator
    reader: CgroupReader
    topology: CpuTopology
    metric_store: MetricStore
    kube: KubeConnection | None  # cluster mode only
    recorder: EventRecorder | None  # cluster mode only
    evictor: Evictor
    hooks: RuntimeHooks
    hook_core: HookCore


def build_services(
    config: AgentConfig, local_mode: bool, bus: EventBus, decisions: DecisionLog, status: dict[str, Any]
) -> Services:
    """Detect the node (cgroup layout, topology, kernel capabilities) and build every shared part."""
    paths = config.paths
    missing = missing_controllers(paths.cgroup_root, config.feature_gates)
    if missing:
        status["not_ready"] = readiness_reason(missing)
        log.error("cgroup controllers missing; not ready", reason=status["not_ready"])
    layout = CgroupLayout.detect(
        paths.cgroup_root,
        proc_root=paths.proc_root,
        sys_root=paths.sys_root,
        crio_cgroupfs_bare_ids=paths.crio_cgroupfs_bare_ids,
    )
    links = layout.resolve_controllers().describe()  # once, at start: ConfigError for a link out of the root
    if links:
        log.info("cgroup controllers linked", root=str(layout.root), controllers=links)
    status["cgroups"] = describe(layout)
    executor = CgroupExecutor(
        layout,
        decisions,
        force_update_seconds=config.executor.resource_force_update_seconds,
        dry_run=config.dry_run or None,
    )
    cookies = config.gate("CoreSched") and os.name == "posix" and layout.core_sched_supported()[0]
    host = HostActuator(
        decisions,
        proc_root=paths.proc_root,
        sys_root=paths.sys_root,
        dry_run=config.dry_run or None,
        cookie_ops=PrctlCookieOps() if cookies else None,
    )
    kube: KubeConnection | None = None
    recorder: EventRecorder | None = None
    if not local_mode:
        # kubernetes-asyncio's loaders take ~0.4 s to import: do it now, at build time, not as one long step
        # on the running loop when the first reflector connects
        import kubernetes_asyncio.config  # noqa: F401

        source = find_source(config.kube.kubeconfig, os.environ)
        kube = KubeConnection.of(source) if source is not None else KubeConnection(config.kube.kubeconfig)
        recorder = RateLimitedRecorder(kube.get, config.node_name)  # one Event per object and reason a minute
    evictor = Evictor(
        decisions,
        kube.get if kube is not None else None,
        recorder,
        config.kube.eviction_qps,
        dry_run=config.dry_run,
    )
    hooks = build_runtime_hooks(config, layout)
    return Services(
        config=config,
        local_mode=local_mode,
        bus=bus,
        decisions=decisions,
        status=status,
        layout=layout,
        executor=executor,
        host=host,
        reader=CgroupReader(layout, dry_run_files=executor.dry_run_files),
        topology=read_topology(paths.sys_root),
        metric_store=MetricStore(config.metrics.retention_seconds, config.metrics.collect_interval_seconds),
        kube=kube,
        recorder=recorder,
        evictor=evictor,
        hooks=hooks,
        hook_core=HookCore(hooks, executor, decisions),
    )


@dataclass
class Parts:
    """The components built for the selected packages (None: that package does not run)."""

    collector: MetricsCollector | None = None
    psi: PSICollector | None = None  # gate PSICollector
    local_sources: LocalSources | None = None
    nodeslo_source: NodeSLOSource | None = None
    reflectors: list[Component] = field(default_factory=list)
    qos_manager: QoSManager | None = None
    reconciler: HookReconciler | None = None
    reporters: Reporters | None = None
    nri: NRIPlugin | None = None
    proxy: ProxyServer | None = None
    http: HTTPServer | None = None

    def components(self) -> list[Component]:
        """Everything to supervise, in build order."""
        out: list[Component] = []
        out += [c for c in (self.collector, self.psi, self.local_sources) if c is not None]
        out += self.reflectors
        out += [c for c in (self.qos_manager, self.reconciler) if c]
        out += self.reporters.components if self.reporters is not None else []
        out += [c for c in (self.nri, self.proxy, self.http) if c]
        return out


def container_demand(cfg: AgentConfig, strategies_on: bool) -> ContainerDemand | None:
    """The collector's container demand for `--container-metrics` (None: every container, `all`).

    `needed` (project decision, docs/performance.md): only CPU burst reads container series (usage and
    throttling: `cpuburst_plan.reads_container_cpu`), and only when the strategies run with it enabled;
    nothing reads a container's memory.
    """
    if cfg.metrics.container_metrics == "all":
        return None
    if not (strategies_on and CPUBurstStrategy().enabled(cfg)):
        return lambda pod, state: ContainerSeries.NONE

    def needed(pod: PodInfo, state: NodeState) -> ContainerSeries:
        slo = state.node_slo
        if reads_container_cpu(pod, slo.cpu_burst_strategy if slo is not None else None):
            return ContainerSeries.CPU
        return ContainerSeries.NONE

    return needed


def cluster_mode_available(cfg: AgentConfig, env: Mapping[str, str] | None = None) -> bool:
    """Whether a kubeconfig (flag, KUBECONFIG, ~/.kube/config) or an in-cluster service account is present
    (`kube.kubeconfig.find_source`; whether it is usable is checked at start: `check_source`)."""
    return find_source(cfg.kube.kubeconfig, os.environ if env is None else env) is not None


def run(agent: Agent) -> None:
    """Run `agent` until stopped on the configured event loop (the agent process: with its GC policy)."""
    if not agent.components:
        agent.build()
    agent.components.append(GcPolicy(agent))
    factory = loop_factory(agent.config.event_loop)
    agent.exit_deadline = ExitDeadline(agent.config.shutdown_timeout_seconds + EXIT_GRACE_SECONDS)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(agent.run())
    except KeyboardInterrupt:
        # Ctrl-C while none of the agent's handlers is installed: during start-up, or a second one while
        # the loop closes after the first stopped the agent. Exit as an interrupted command does.
        print("koordqos: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


class Agent:
    """The whole node agent."""

    def __init__(
        self,
        config: AgentConfig,
        packages: Collection[str] | None = None,
        local_mode: bool | None = None,
    ) -> None:
        self.config = config
        self.bus = EventBus()
        self.decisions = DecisionLog(dry_run=config.dry_run)
        self.local_mode = (not cluster_mode_available(config)) if local_mode is None else local_mode
        self.status: dict[str, Any] = {}
        self.supervisor = Supervisor()
        self.lag = LoopLagMonitor()
        unknown = set(packages or ()) - set(PACKAGES)
        if unknown:
            raise ValueError(f"unknown packages {sorted(unknown)} (known: {', '.join(PACKAGES)})")
        self.packages = frozenset(PACKAGES if packages is None else packages)
        self._stop = asyncio.Event()
        self._services: Services | None = None
        self.parts = Parts()
        self.components: list[Component] = []
        self._shutdown: list[ShutdownStep] = []
        self.exit_deadline: ExitDeadline | None = None  # the process's (set by `run`)

    @property
    def services(self) -> Services:
        """The shared services (built by `build`)."""
        if self._services is None:
            raise RuntimeError("agent not built yet")
        return self._services

    def on_shutdown(self, step: ShutdownStep) -> None:
        """Run `step` once after every component stopped (close clients, sockets), within the timeout."""
        self._shutdown.append(step)

    def build(self) -> None:
        """Build the services, then the components of the selected packages."""
        # unusable host roots: one error line (the CLI's), before anything is logged
        paths = self.config.paths
        check_host_roots(paths.cgroup_root, paths.proc_root, paths.sys_root)
        if not self.local_mode:  # a kubeconfig that cannot select a cluster: one line, exit 2 (#32 5e)
            source = find_source(self.config.kube.kubeconfig, os.environ)
            if source is not None:
                check_source(source)
        # the first log line announces the mode (before any package logs while it is built)
        log.info(
            "koordqos starting",
            mode="local" if self.local_mode else "cluster",
            node=self.config.node_name,
            dry_run=self.config.dry_run,
            event_loop="asyncio" if loop_factory(self.config.event_loop) is None else "uvloop",
        )
        not_implemented, not_acted_on = inert_gates(self.config.feature_gates)
        if not_implemented or not_acted_on:  # accepted (a koordlet DaemonSet's gates start koordqos), inert
            log.warning(
                "feature gates on that koordqos does not act on; they change nothing",
                not_implemented=not_implemented,
                not_acted_on_yet=not_acted_on,
            )
        svc = build_services(self.config, self.local_mode, self.bus, self.decisions, self.status)
        self._services = svc
        if svc.kube is not None:
            self.on_shutdown(svc.kube.close)
        self.parts = self._build_parts(svc)
        comps: list[Component] = [FunctionComponent("bus", self.bus.run, essential=True), self.lag]
        if svc.layout.version is CgroupVersion.V1:  # systemd's controller links, looked at again
            comps.append(FunctionComponent("cgroup-controllers", svc.layout.watch_controllers))
        self.components = comps + self._after_sync(self.parts.components())
        # Start-up leaves ~80k long-lived objects (imports, models); a full collection of them costs 50-90 ms
        # on the loop. Freezing them once keeps every later GC pass short (bench/watch.py --gc-freeze).
        gc.collect()
        gc.freeze()

    def _after_sync(self, components: list[Component]) -> list[Component]:
        """The QoS strategies and the reconciler start once pods, Node and NodeSLO have synced once (#32 5e;
        koordlet waits for its states informer): nothing they write comes from a partial view; with
        `--runtime-hooks-wait-for-sync` the NRI plugin and the proxy too (koordlet's order). Only with the
        agent's own sources (the `kube` package); without them whoever drives the bus is the source."""
        if "kube" not in self.packages:
            return components
        parts = self.parts
        gated: list[Component | None] = [parts.qos_manager, parts.reconciler]
        if self.config.hooks.wait_for_sync:
            gated += [parts.nri, parts.proxy]
        acting = {id(c) for c in gated if c is not None}
        if not acting:
            return components
        gate = SyncGate(self.bus, READY_SOURCES, self.status)
        return [AfterSync(c, gate) if id(c) in acting else c for c in components]

    def _build_parts(self, svc: Services) -> Parts:
        cfg, on = self.config, self.packages
        parts = Parts()
        if "metrics" in on:
            parts.collector = MetricsCollector(
                svc.bus,
                svc.layout,
                svc.reader,
                svc.metric_store,
                proc_root=cfg.paths.proc_root,
                sys_root=cfg.paths.sys_root,  # NUMA usage for the NodeMetric's numaUsages
                topology=svc.topology,
                interval=cfg.metrics.collect_interval_seconds,
                container_demand=container_demand(cfg, "strategies" in on),
            )
            if cfg.gate("PSICollector") or cfg.gate("PSIInterference"):  # the rules read what it collects
                parts.psi = PSICollector(
                    svc.bus,
                    svc.layout,
                    svc.reader,
                    node_name=cfg.node_name,
                    proc_root=cfg.paths.proc_root,
                    interval=cfg.metrics.collect_interval_seconds,
                    hybrid_pods=cfg.psi.hybrid_pods,
                )
        if "kube" in on:
            if svc.kube is None:
                parts.local_sources = LocalSources(svc.bus, cfg, svc.layout)
                parts.nodeslo_source = parts.local_sources.nodeslo
            else:
                assert svc.recorder is not None
                reflectors, parts.nodeslo_source = cluster_sources(svc.bus, svc.kube, svc.recorder, cfg)
                parts.reflectors = list(reflectors)
        if "strategies" in on:
            parts.qos_manager = build_qos_manager(
                config=cfg,
                bus=svc.bus,
                decisions=svc.decisions,
                status=svc.status,
                layout=svc.layout,
                reader=svc.reader,
                executor=svc.executor,
                host=svc.host,
                metric_store=svc.metric_store,
                topology=svc.topology,
                evictor=svc.evictor,
                recorder=svc.recorder,
                psi=parts.psi,
                node_marker=(
                    NodeMarker(svc.kube.get, cfg.node_name)
                    if svc.kube is not None and cfg.gate("PSIInterference")
                    else None
                ),
            )
        hooks_on = "hooks" in on
        if hooks_on:
            parts.reconciler = self._build_reconciler(svc)
        if "report" in on:
            parts.reporters = self._build_reporters(svc, hooks_on)
        if "nri" in on:
            if cfg.nri.enabled:
                handler = NRIHooks(svc.hook_core, svc.layout) if hooks_on else no_hooks
                parts.nri = build_plugin(svc.bus, cfg, handler, svc.status, svc.decisions)
            else:
                svc.status["nri"] = "disabled"
        if "proxy" in on:
            if cfg.hooks.proxy_enabled:
                parts.proxy = build_server(
                    cfg.hooks, svc.bus, svc.layout, svc.hook_core, svc.decisions, svc.status
                )
            else:
                svc.status["proxy"] = "disabled"
        if "server" in on:
            parts.http = HTTPServer(cfg.server, self)
        return parts

    def _build_reporters(self, svc: Services, hooks_on: bool) -> Reporters:
        """NodeMetric, NodeResourceTopology and (standalone) batch capacity; the NRT result feeds the
        CPUSetAllocator hook's share pools."""
        cfg = self.config
        if cfg.report.batch_resource_source == "agent" and svc.kube is None:
            raise ConfigError(
                "--batch-resource-source=agent needs a cluster (no kubeconfig or service account)"
            )
        hooks = svc.hooks

        def on_topology(want: NRTDesired) -> None:
            if hooks_on:
                hooks.update_topology(want.annotations)

        reporters = build_reporters(
            cfg,
            svc.bus,
            svc.topology,
            svc.kube.get if svc.kube is not None else None,
            on_topology=on_topology,
        )
        if hooks_on:
            # the share pools of the state a reconcile pass or the NRI Synchronize plans from
            nrt = reporters.topology

            def topology_of(state: NodeState) -> Mapping[str, str] | None:
                want = nrt.desired_for(state)
                return None if want is None else want.annotations

            hooks.topology_source = topology_of
        svc.status["report"] = reporters
        return reporters

    def _build_reconciler(self, svc: Services) -> HookReconciler:
        cfg, hooks = self.config, svc.hooks
        policy = parse_failure_policy(cfg.hooks.failure_policy)
        gi = hooks.group_identity
        core_reason = hooks.core_sched.reason if hooks.core_sched is not None else "gate off"
        svc.status["runtime_hooks"] = {"enabled": hooks.names, "failure_policy": policy}
        log.info(
            "runtime hooks",
            enabled=hooks.names,
            policy=policy,
            bvt=gi is not None and gi.system.supported,
            core_sched=core_reason,
        )
        return HookReconciler(
            hooks,
            svc.layout,
            svc.executor,
            svc.host,
            svc.decisions,
            bus=svc.bus,
            interval=cfg.hooks.reconcile_interval_seconds,
            pod_sources=LOCAL_POD_SOURCES if svc.local_mode else CLUSTER_POD_SOURCES,
        )

    # -- what the HTTP endpoints read (server.http.AgentView) ------------------------------------

    @property
    def ready(self) -> bool:
        """Pods, Node and NodeSLO sources have synced, and nothing keeps the agent unready (`not_ready`)."""
        return "not_ready" not in self.status and self.bus.state.synced >= READY_SOURCES

    @property
    def state(self) -> NodeState:
        """The newest NodeState."""
        return self.bus.state

    @property
    def loop_lag(self) -> float:
        """Seconds the last loop-lag probe woke late."""
        return self.lag.last_lag

    def stop(self) -> None:
        """Ask the agent to stop (safe from signal handlers)."""
        self._stop.set()

    async def _run_shutdown(self, timeout: float) -> None:
        """Run the shutdown callbacks (in reverse registration order); failures are logged, never raised."""
        try:
            async with asyncio.timeout(timeout):
                for func in reversed(self._shutdown):
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
        if loopwatch.enabled():  # KOORDQOS_LOOP_WATCH=1: time every step (bench/agent.py; /debug/loop)
            loopwatch.install(loop)
        if not self.components:
            self.build()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        try:
            await self._before_components()
        except BaseException:
            await self._close_listeners()
            raise
        build_kind = describe_build()
        obs.BUILD_INFO.labels(__version__, build_kind).set(1)
        log.info("components starting", components=[c.name for c in self.components], build=build_kind)
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._run_components(loop, tasks)
        except* StartupError as group:
            raise group.exceptions[0] from None
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        log.info("koordqos stopped")

    async def _before_components(self) -> None:
        """What must hold before any component starts, each failure one line and exit 2 (ConfigError or
        StartupError): the HTTP address and the proxy socket bound (a taken port exits before anything
        acts), the cluster configuration loaded (not retried forever), and koord-manager not owning the
        batch resources (`--batch-resource-source=agent`)."""
        parts = self.parts
        if parts.http is not None:
            await parts.http.bind()
        if parts.proxy is not None:
            parts.proxy.bind()
        kube = self._services.kube if self._services is not None else None
        if kube is not None:
            try:
                await kube.get()  # the loader's own failures (exec plugin, certificates, in-cluster files)
            except KubeError as exc:
                raise ConfigError(str(exc)) from None
        reporters = parts.reporters
        if reporters is not None and reporters.batch is not None:
            await reporters.batch.preflight()  # ConfigError (exit 2) when koord-manager owns batch resources

    async def _close_listeners(self) -> None:
        """Undo `_before_components`' binds when the agent stops before its components run."""
        if self.parts.proxy is not None:
            self.parts.proxy.unbind()
        if self.parts.http is not None:
            await self.parts.http.close()

    async def _run_components(self, loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Task[None]]) -> None:
        """Supervise every component until `stop()`, then stop them within the shutdown timeout."""
        async with asyncio.TaskGroup() as tg:
            for comp in self.components:
                tasks.append(tg.create_task(self.supervisor.supervise(comp), name=comp.name))
            stopper = tg.create_task(self._stop.wait(), name="stop")
            await stopper
            log.info("stopping", timeout_s=self.config.shutdown_timeout_seconds)
            if self.exit_deadline is not None:
                self.exit_deadline.arm()
            deadline = loop.time() + self.config.shutdown_timeout_seconds
            pending = await cancel_until(self.exit_deadline, set(tasks), deadline)
            if pending:
                log.error("components did not stop in time", components=sorted(t.get_name() for t in pending))
            await self._run_shutdown(max(0.1, deadline - loop.time()))
