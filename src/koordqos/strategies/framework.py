"""The QoS manager (docs/behaviour-qos-manager.md): a registry of strategies run on metric ticks, each at its
own interval.

Each enabled strategy gets its own bus subscription (own queue and task), so a slow one (an eviction
waiting on the API server) never delays another. A strategy's round is `plan` (pure: state + metrics +
config → intents) and actuation through `StrategyEnv` (cgroup executor, evictor). A round that raises is
logged, counted and skipped; the strategy runs again at its next interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from prometheus_client import Counter, Histogram

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, WriteResult
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.config import AgentConfig
from koordqos.decisions import DecisionLog
from koordqos.errors import CgroupError
from koordqos.events.types import MetricTick
from koordqos.host import HostActuator
from koordqos.metrics.psi import PSISnapshot
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import CpuTopology
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.once import SeenOnce
from koordqos.state import NodeState
from koordqos.strategies.cpupick import Processor
from koordqos.strategies.eviction import EVICTED_REASON, EvictionOutcome, EvictTask, kill_and_evict
from koordqos.strategies.intents import BEDir

log = structlog.get_logger("koordqos.strategies")

APPLY_CHUNK = 100  # cgroup writes handed to the executor between two yields to the loop
# a strategy's long loop (over pods or dirs) yields to the event loop after this much time in one slice
YIELD_AFTER_SECONDS = 0.002

STRATEGY_RUNS = Counter(
    "koordqos_strategy_runs_total",
    "QoS strategy rounds by strategy and result (ok, failed)",
    ["strategy", "result"],
    registry=obs.REGISTRY,
)
STRATEGY_SECONDS = Histogram(
    "koordqos_strategy_round_seconds",
    "Wall time of one QoS strategy round",
    ["strategy"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
    registry=obs.REGISTRY,
)
EVICTIONS = Counter(
    "koordqos_strategy_evictions_total",
    "Pods evicted (or recorded in dry-run) by strategy and feature",
    ["strategy", "feature"],
    registry=obs.REGISTRY,
)
INVALID_CONFIG = Counter(
    "koordqos_strategy_invalid_config_total",
    "Rounds a feature skipped because its NodeSLO config is invalid",
    ["feature"],
    registry=obs.REGISTRY,
)


class Evictor(Protocol):
    """The evictor service (kube): evicts once, remembers evicted UIDs for 2 minutes, dry-run aware."""

    async def evict(self, pod: PodInfo, reason: str, message: str, strategy: str) -> bool: ...

    def is_evicted(self, pod: PodInfo) -> bool: ...


class EventSink(Protocol):
    """Kubernetes Events (the kube recorder, rate-limited; planners do not import the cluster client)."""

    async def record(
        self, involved: Mapping[str, str], event_type: str, reason: str, message: str
    ) -> bool: ...


class NodeMarker(Protocol):
    """Marks the Node (kube; None in local mode): a condition and a PreferNoSchedule taint, set or cleared."""

    async def mark(self, condition: str, taint_key: str, reason: str, message: str) -> bool: ...

    async def unmark(self, condition: str, taint_key: str, reason: str, message: str) -> bool: ...


class PSISource(Protocol):
    """The PSI collector's newest round (None until its first)."""

    @property
    def last(self) -> PSISnapshot | None: ...


@dataclass
class SuppressTightening:
    """How far below its own target CPU suppress is held (the PSI interference rule sets it).

    CPU suppress subtracts `milli` from its target each round and notes the untightened target and its floor
    here, so the rule knows how much room is left."""

    milli: int = 0
    suppress_milli: int | None = None  # CPU suppress's own target last round (None: not acting)
    floor_milli: int = 0


class QoSStrategy(Protocol):
    """A QoS strategy: a name, whether it runs (gates + interval), its interval, and one round."""

    name: str

    def enabled(self, config: AgentConfig) -> bool: ...

    def interval(self, config: AgentConfig) -> float: ...

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None: ...


class Pace:
    """Yield to the event loop once a slice has run YIELD_AFTER_SECONDS (by elapsed time, not by item
    count: an item's cost varies from a dict lookup to a file read)."""

    __slots__ = ("_since", "limit")

    def __init__(self, limit: float = YIELD_AFTER_SECONDS) -> None:
        self.limit = limit
        self._since = time.perf_counter()

    async def __call__(self) -> None:
        if time.perf_counter() - self._since >= self.limit:
            await asyncio.sleep(0)
            self._since = time.perf_counter()


@dataclass
class StrategyEnv:
    """What strategies read and act through, typed: built once from the agent's services.

    Readers: `layout` (cgroup dirs), `reader` (cgroup files), `store` (metrics), `topology` (CPUs, None
    when unknown). Actuators: `executor` (cgroup writes), `host` (sysctl, oom_score_adj, cookies),
    `evictor` (None: evictions are only recorded), `events` (Kubernetes Events; None in local mode).
    `clock` is the monotonic time strategies plan with.
    """

    config: AgentConfig
    decisions: DecisionLog
    layout: CgroupLayout
    reader: CgroupReader
    executor: CgroupExecutor
    store: MetricStore
    host: HostActuator
    topology: CpuTopology | None = None
    evictor: Evictor | None = None
    events: EventSink | None = None  # cluster mode only
    psi: PSISource | None = None  # gate PSICollector
    node_marker: NodeMarker | None = None  # cluster mode only
    tightening: SuppressTightening = field(default_factory=SuppressTightening)
    clock: Callable[[], float] = time.monotonic
    _warned: SeenOnce[str] = field(default_factory=SeenOnce)

    @property
    def collect_interval(self) -> float:
        """The metrics collection interval (seconds)."""
        return self.config.metrics.collect_interval_seconds

    @property
    def dry_run(self) -> bool:
        """Record decisions, change nothing."""
        return self.decisions.dry_run

    def warn_once(self, key: str, message: str, **kw: object) -> None:
        """Log a warning the first time `key` is seen (bad config repeats every tick)."""
        if self._warned.first(key):
            log.warning(message, **kw)

    def forget_warning(self, key: str) -> None:
        """Let `key` warn again (the condition went away)."""
        self._warned.discard(key)

    # -- topology ------------------------------------------------------------------------------------------

    def cpu_count(self) -> int | None:
        """How many CPUs the node has (None when the topology is unknown)."""
        return None if self.topology is None else len(self.topology.cpus)

    def processors(self) -> list[Processor]:
        """The node's CPUs with core, socket and NUMA node (empty when unknown)."""
        if self.topology is None:
            return []
        return [Processor(c.cpu, c.core, c.socket, c.node) for c in self.topology.cpus]

    # -- cgroups -------------------------------------------------------------------------------------------

    def be_dir(self) -> str:
        """Relative dir of the besteffort QoS cgroup."""
        return str(self.layout.qos_dir(KubeQoS.BESTEFFORT))

    def be_cpuset_dirs(self, max_depth: int = 2) -> list[BEDir]:
        """The besteffort dir and its sub-dirs down to `max_depth`, in walk order (sorted, pre-order)."""
        walk = self._walk_be_dirs(max_depth)
        out: list[BEDir] = []
        for found in walk:
            out += found
        return out

    async def be_cpuset_dirs_paced(self, max_depth: int = 2, pace: Pace | None = None) -> list[BEDir]:
        """`be_cpuset_dirs`, yielding to the loop between dir reads when a slice ran long (1,000 pods:
        ~1,000 scandirs)."""
        pace = pace or Pace()
        out: list[BEDir] = []
        for found in self._walk_be_dirs(max_depth):
            out += found
            await pace()
        return out

    def _walk_be_dirs(self, max_depth: int) -> Iterator[list[BEDir]]:
        """The walk, one dir read at a time: yields the dirs each read adds, in pre-order."""
        root = self.be_dir()
        try:
            if not self.layout.subsystem_dir(root, "cpuset").is_dir():
                return
        except CgroupError:
            return
        yield [BEDir(root, 0)]
        yield from _walk_under(self.layout, root, 1, max_depth)

    def be_quota(self) -> int | None:
        """The besteffort dir's current cfs quota (µs; −1 unlimited), None when unreadable."""
        qp = self.reader.cpu_quota_period(self.be_dir())
        return None if qp is None else int(qp[0])

    def be_cpuset(self) -> tuple[int, ...] | None:
        """The besteffort dir's current cpuset.cpus, None when unreadable."""
        cpus = self.reader.cpuset(self.be_dir())
        return None if cpus is None else tuple(sorted(cpus))

    def pod_dir(self, pod: PodInfo) -> str | None:
        """A pod's relative cgroup dir (None for a hostile uid)."""
        try:
            return str(self.layout.pod_dir(pod))
        except CgroupError:
            return None

    def container_dir(self, pod_dir: str, container_id: str) -> str:
        """A container's relative cgroup dir in `pod_dir` (CgroupError for a hostile id)."""
        return str(self.layout.container_dir_in(pod_dir, container_id))

    async def apply(
        self, strategy: str, writes: Sequence[CgroupWrite], reason: str = ""
    ) -> list[WriteResult]:
        """Hand writes to the executor in order, in chunks (a write's own reason goes to the decisions)."""
        results: list[WriteResult] = []
        for start in range(0, len(writes), APPLY_CHUNK):
            if start:
                await asyncio.sleep(0)  # hundreds of cpuset dirs: never hold the loop for one long step
            results += await self.executor.apply_sequential(
                strategy, writes[start : start + APPLY_CHUNK], reason
            )
        return results

    # -- evictions -----------------------------------------------------------------------------------------

    async def evict(self, strategy: str, tasks: Sequence[EvictTask], audit_reason: str) -> EvictionOutcome:
        """Run the eviction pass over `tasks` through the evictor (dry-run: the evictor only records)."""
        evictor = self.evictor
        for task in tasks:
            self.decisions.record(
                strategy,
                task.feature,
                "evict-task",
                None,
                dict(task.to_release),
                f"{audit_reason}: {task.reason}",
                quiet=True,
            )

        async def evict_one(task: EvictTask, pod: PodInfo) -> bool:
            if evictor is None:
                self.decisions.record(
                    strategy, pod.key, "evict", None, task.feature, task.message(pod), dry_run=True
                )
                return True
            ok = await evictor.evict(pod, EVICTED_REASON, task.message(pod), strategy)
            if ok:
                EVICTIONS.labels(strategy, task.feature).inc()
            return ok

        def is_evicted(pod: PodInfo) -> bool:
            return evictor is not None and evictor.is_evicted(pod)

        return await kill_and_evict(tasks, is_evicted, evict_one)


def _walk_under(layout: CgroupLayout, rel: str, depth: int, max_depth: int) -> Iterator[list[BEDir]]:
    """Sub-dirs of `rel` in cpuset (sorted), each before its own sub-dirs, to `max_depth`; listed beneath
    the cgroup root (`CgroupLayout.list_subdirs`): a dir swapped for a symlink is not descended into."""
    if depth > max_depth:
        return
    entries = layout.list_subdirs(rel, "cpuset")
    if depth == max_depth:  # the deepest level is listed, not read
        yield [BEDir(f"{rel}/{name}", depth) for name in entries]
        return
    for name in entries:
        child = f"{rel}/{name}"
        yield [BEDir(child, depth)]
        yield from _walk_under(layout, child, depth + 1, max_depth)


@dataclass
class _Runner:
    strategy: QoSStrategy
    interval: float
    last_start: float = float("-inf")
    runs: int = 0
    failures: int = 0


class QoSManager:
    """The component: subscribes each enabled strategy to metric ticks; rounds run at strategy intervals."""

    name = "qos-manager"
    essential = False

    def __init__(
        self,
        env: StrategyEnv,
        bus: EventBus,
        strategies: Iterable[QoSStrategy],
        *,
        status: MutableMapping[str, Any] | None = None,
    ) -> None:
        self.env = env
        self.bus = bus
        self.status: MutableMapping[str, Any] = {} if status is None else status  # /readyz, /debug/state
        cfg = env.config
        self.runners: dict[str, _Runner] = {}
        self.disabled: list[str] = []
        for s in strategies:
            if s.enabled(cfg):
                self.runners[s.name] = _Runner(s, s.interval(cfg))
            else:
                self.disabled.append(s.name)
        self._subscribed = False

    def subscribe(self) -> None:
        """Subscribe every enabled strategy to MetricTick (once)."""
        if self._subscribed:
            return
        self._subscribed = True
        for name, runner in self.runners.items():
            self.bus.subscribe(f"qos:{name}", self._handler(runner), MetricTick)
        log.info("qos manager started", enabled=list(self.runners), disabled=self.disabled)

    def _handler(self, runner: _Runner) -> Callable[[MetricTick, NodeState], Awaitable[None]]:
        async def handle(event: MetricTick, state: NodeState) -> None:
            await self.tick(runner, state)

        return handle

    async def tick(self, runner: _Runner, state: NodeState) -> None:
        """Run `runner`'s strategy if its interval has passed (half a collect interval of slack)."""
        now = self.env.clock()
        if now < runner.last_start + runner.interval - self.env.collect_interval / 2:
            return
        runner.last_start = now
        name = runner.strategy.name
        started = time.perf_counter()
        try:
            await runner.strategy.run_once(state, self.env)
            runner.runs += 1
            STRATEGY_RUNS.labels(name, "ok").inc()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            runner.failures += 1
            STRATEGY_RUNS.labels(name, "failed").inc()
            obs.ERRORS.labels(f"strategy:{name}", type(exc).__name__).inc()
            log.error(
                "strategy round failed",
                strategy=name,
                error=f"{type(exc).__name__}: {exc}",
                failures=runner.failures,
                exc_info=exc,
            )
        finally:
            STRATEGY_SECONDS.labels(name).observe(time.perf_counter() - started)

    async def run(self) -> None:
        """Subscribe, then idle: rounds run on the bus subscriber tasks."""
        self.subscribe()
        self.status["qos"] = {"enabled": list(self.runners), "disabled": self.disabled}
        await asyncio.Event().wait()
