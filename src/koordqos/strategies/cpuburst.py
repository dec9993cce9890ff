"""CPUBurst (spec §2.4): let latency-sensitive containers absorb short spikes instead of being throttled.

Two mechanisms, both per container of burstable pods (raw QoS LS, SYSTEM or unlabeled):
* static: a CFS burst budget (`cpu.cfs_burst_us` / v2 `cpu.max.burst`) of `cpuBurstPercent` of the CPU limit;
* dynamic: the container's CFS quota grows ×1.2 per round while it is throttled, and shrinks ×0.8 while the
  node's shared CPU pool is overloaded (or a per-container token bucket runs dry), always within
  [base, base × cfsQuotaBurstPercent]; the pod quota moves by the same delta.

Config: NodeSLO `cpuBurstStrategy` merged field by field with the pod annotation `koordinator.sh/cpuBurst`
(or, without one, what a grey-control injector hands out). Decisions (scaleUp, scaleDown, reset, remain)
carry the node state as their reason; writes go through the cgroup executor (cacheable, dry-run aware).
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from prometheus_client import Counter, Gauge

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupWrite, Level, WriteResult
from koordqos.config import AgentConfig
from koordqos.errors import CgroupError
from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.nodeslo import CPUBurstConfig, merge_pod_cpu_burst
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import QoSClass
from koordqos.state import NodeState
from koordqos.strategies.framework import StrategyEnv

log = structlog.get_logger("koordqos.strategies.cpuburst")

NAME = "CPUBurst"
GATE = "CPUBurst"

CFS_PERIOD = 100_000  # µs, CFS base period
MIN_QUOTA = 1000  # µs, the kernel's smallest quota
SCALE_UP_RATIO = 1.2
SCALE_DOWN_RATIO = 0.8
COOLING_RATIO = 0.9  # cooling band: threshold × 0.9 ≤ ratio < threshold
LIMITER_CONSUME_PERCENT = 100  # usage at or above the limit spends tokens
LIMITER_SAVE_PERCENT = 60  # usage below this saves tokens
NODE_WINDOW_INTERVALS = 5
YIELD_EVERY = 10  # pods per synchronous slice: a round over many pods never holds the loop for long
NODE_WINDOW_MAX_SECONDS = 10.0

# NodeSLO defaults (a merged NodeSLO always carries them; these cover a config built by hand)
DEFAULT_CPU_BURST_PERCENT = 1000
DEFAULT_SHARE_POOL_THRESHOLD_PERCENT = 50

BURST_FILE = "cpu.cfs_burst_us"
QUOTA_FILE = "cpu.cfs_quota_us"

CPU_BURST_OPERATIONS = Counter(
    "koordqos_cpuburst_operations_total",
    "CFS quota burst operations decided per container and round (scaleUp, scaleDown, reset, remain)",
    ["operation"],
    registry=obs.REGISTRY,
)
CPU_BURST_NODE_STATE = Gauge(
    "koordqos_cpuburst_node_state",
    "Node state for CFS quota burst (1 for the current state: idle, cooling, overload, unknown)",
    ["state"],
    registry=obs.REGISTRY,
)
CPU_BURST_SCALED = Gauge(
    "koordqos_cpuburst_scaled_containers",
    "Containers whose CFS quota is above its base after the last round",
    registry=obs.REGISTRY,
)
CPU_BURST_SKIPPED = Counter(
    "koordqos_cpuburst_skipped_total",
    "Containers or pods skipped by CPU burst, by reason (quota unreadable, unsupported burst file, ...)",
    ["reason"],
    registry=obs.REGISTRY,
)


class NodeBurstState(enum.StrEnum):
    """How busy the node's shared CPU pool is."""

    IDLE = "idle"
    COOLING = "cooling"
    OVERLOAD = "overload"
    UNKNOWN = "unknown"


class Operation(enum.StrEnum):
    """What to do with a container's CFS quota this round."""

    SCALE_UP = "scaleUp"
    SCALE_DOWN = "scaleDown"
    RESET = "reset"
    REMAIN = "remain"


# -- config -------------------------------------------------------------------------------------------------


def cpu_burst_enabled(policy: str | None) -> bool:
    """Static burst is on for policies `auto` and `cpuBurstOnly`."""
    return policy in ("auto", "cpuBurstOnly")


def cfs_quota_burst_enabled(policy: str | None) -> bool:
    """Dynamic quota burst is on for policies `auto` and `cfsQuotaBurstOnly`."""
    return policy in ("auto", "cfsQuotaBurstOnly")


GreyControlInjector = Callable[[PodInfo], CPUBurstConfig | None]


def pod_burst_config(
    node_cfg: CPUBurstConfig | None, pod: PodInfo, injectors: Iterable[GreyControlInjector] = ()
) -> CPUBurstConfig | None:
    """The pod's effective config: its annotation (else a grey-control injection) merged over the node's."""
    pod_cfg = pod.cpu_burst
    if pod_cfg is None:
        for inject in injectors:
            injected = inject(pod)
            if injected is not None:
                pod_cfg = merge_pod_cpu_burst(pod_cfg, injected)
    return merge_pod_cpu_burst(node_cfg, pod_cfg)


def burstable(pod: PodInfo) -> bool:
    """Raw QoS LSR, LSE and BE pods are never burst; LS, SYSTEM and unlabeled pods are."""
    return pod.qos_raw not in (QoSClass.LSR, QoSClass.LSE, QoSClass.BE)


# -- node state ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharePool:
    """The shared CPU pool: CPUs not requested by LSE/LSR pods, and what non-LSE/LSR/BE work uses of it."""

    total: float
    usage: float

    @property
    def ratio(self) -> float:
        """usage ÷ total (1.0 when nothing is left to share)."""
        return self.usage / self.total if self.total > 0 else 1.0


def share_pool(
    cpu_count: int, node_usage: float, pods: Iterable[PodInfo], pod_usage: Mapping[str, float]
) -> SharePool:
    """Share pool total = CPUs − LSE/LSR requests; usage = node usage − LSE/LSR/BE pod usage (cores)."""
    total = float(cpu_count)
    usage = node_usage
    for pod in pods:
        qos = pod.qos_raw
        if qos in (QoSClass.LSE, QoSClass.LSR):
            total -= pod.request("cpu") / 1000
        if qos in (QoSClass.LSE, QoSClass.LSR, QoSClass.BE):
            usage -= pod_usage.get(pod.uid, 0.0)
    return SharePool(total, usage)


def classify_share_pool(ratio: float, threshold_percent: int) -> NodeBurstState:
    """ratio ≥ threshold → overload; threshold × 0.9 ≤ ratio → cooling; else idle."""
    threshold = threshold_percent / 100
    if ratio >= threshold:
        return NodeBurstState.OVERLOAD
    if ratio >= threshold * COOLING_RATIO:
        return NodeBurstState.COOLING
    return NodeBurstState.IDLE


def node_state_for_burst(
    threshold_percent: int,
    cpu_count: int | None,
    node_usage: float | None,
    pods: Iterable[PodInfo],
    pod_usage: Mapping[str, float],
) -> tuple[NodeBurstState, SharePool | None]:
    """The node state from the shared pool (unknown without node usage or CPU info)."""
    if node_usage is None or not cpu_count:
        return NodeBurstState.UNKNOWN, None
    pool = share_pool(cpu_count, node_usage, pods, pod_usage)
    return classify_share_pool(pool.ratio, threshold_percent), pool


def node_window(reconcile_interval: float) -> float:
    """The averaging window of node and pod usage: min(5 × reconcile interval, 10 s)."""
    return min(NODE_WINDOW_INTERVALS * reconcile_interval, NODE_WINDOW_MAX_SECONDS)


# -- static burst -------------------------------------------------------------------------------------------


def static_burst_us(limit_milli: int, cfg: CPUBurstConfig) -> int:
    """A container's burst budget: limit (cores) × cpuBurstPercent % × period; 0 when off or unlimited."""
    if not cpu_burst_enabled(cfg.policy) or limit_milli <= 0:
        return 0
    percent = cfg.cpu_burst_percent if cfg.cpu_burst_percent is not None else DEFAULT_CPU_BURST_PERCENT
    return int((limit_milli / 1000) * (percent / 100) * CFS_PERIOD)


@dataclass(frozen=True, slots=True)
class StaticBurst:
    """Static burst values of one pod: per container dir, and the pod dir's sum."""

    containers: tuple[tuple[str, int], ...]
    pod: int


def plan_static_burst(
    pod: PodInfo,
    cfg: CPUBurstConfig,
    container_dir: Callable[[ContainerInfo], str | None],
    cap_at_quota: bool = False,
) -> StaticBurst:
    """Burst values for the pod's started containers (with a resolvable dir) and the pod's total.

    `cap_at_quota` limits each container's burst to its base quota (limit × period): mainline kernels refuse a
    burst larger than the quota (EINVAL), and the base is the lowest quota the dynamic part ever sets, so the
    burst then stays valid whatever the quota does.
    """
    out: list[tuple[str, int]] = []
    total = 0
    for c in pod.containers:
        if not c.container_id:
            continue
        d = container_dir(c)
        if d is None:
            continue
        limit = c.limits.get("cpu", 0)
        value = static_burst_us(limit, cfg)
        base = base_quota(limit)
        if cap_at_quota and base is not None:
            value = min(value, base)
        out.append((d, value))
        total += value
    return StaticBurst(tuple(out), total)


# -- dynamic quota ------------------------------------------------------------------------------------------


def base_quota(limit_milli: int) -> int | None:
    """The container's quota from its CPU limit (at least 1000 µs); None without a limit."""
    if limit_milli <= 0:
        return None
    return max(limit_milli * CFS_PERIOD // 1000, MIN_QUOTA)


def ceil_quota(base: int, cfs_quota_burst_percent: int | None) -> int:
    """base × cfsQuotaBurstPercent % when the percent exceeds 100, else base."""
    if cfs_quota_burst_percent is not None and cfs_quota_burst_percent > 100:
        return base * cfs_quota_burst_percent // 100
    return base


def container_operation(policy: str | None, allowed: bool, throttled: float | None) -> Operation:
    """Own operation: reset when off, scaleDown when the limiter refuses, else by throttling."""
    if not cfs_quota_burst_enabled(policy):
        return Operation.RESET
    if not allowed:
        return Operation.SCALE_DOWN
    if throttled is None:
        return Operation.REMAIN
    return Operation.SCALE_UP if throttled > 0 else Operation.REMAIN


def apply_node_state(op: Operation, state: NodeBurstState) -> Operation:
    """Overload turns scaleUp/remain into scaleDown; cooling and unknown turn scaleUp into remain."""
    if state is NodeBurstState.OVERLOAD and op in (Operation.SCALE_UP, Operation.REMAIN):
        return Operation.SCALE_DOWN
    if state in (NodeBurstState.COOLING, NodeBurstState.UNKNOWN) and op is Operation.SCALE_UP:
        return Operation.REMAIN
    return op


def target_quota(op: Operation, cur: int, base: int, ceil: int) -> int:
    """cur ×1.2 / ×0.8, base on reset, cur on remain; then clamped to [base, ceil]."""
    if op is Operation.SCALE_UP:
        target = int(cur * SCALE_UP_RATIO)
    elif op is Operation.SCALE_DOWN:
        target = int(cur * SCALE_DOWN_RATIO)
    elif op is Operation.RESET:
        target = base
    else:
        target = cur
    return min(max(target, base), ceil)


def quota_writes(
    pod_dir: str, container_dir: str, pod_cur: int, container_cur: int, delta: int
) -> list[CgroupWrite]:
    """The pod (if limited) and container quota writes for `delta`, in an order the kernel accepts.

    On cgroup v1 a child's quota may not exceed its parent's: grow the pod first, shrink the container first.
    """
    container = CgroupWrite(container_dir, QUOTA_FILE, container_cur + delta, Level.CONTAINER)
    if pod_cur <= 0:  # pod unlimited (-1): nothing to move there
        return [container]
    pod = CgroupWrite(pod_dir, QUOTA_FILE, pod_cur + delta, Level.POD)
    return [pod, container] if delta > 0 else [container, pod]


# -- burst limiter (token bucket per container) -------------------------------------------------------------


@dataclass
class BurstLimiter:
    """Token bucket limiting how long a container may run above its limit (one token = 1 %·s over it)."""

    capacity: int
    tokens: int
    last_update: float
    expire_seconds: float

    @classmethod
    def new(
        cls, period_seconds: int, percent: int, now: float, rand: Callable[[], float] = random.random
    ) -> BurstLimiter:
        """capacity = period × (percent − 100), started below half full at random (pods desynchronised)."""
        capacity = period_seconds * (percent - 100)
        return cls(capacity, int(capacity * rand() * 0.5), now, 2.0 * period_seconds)

    def allow(self, now: float, usage_percent: int) -> bool:
        """Spend tokens above 100 % usage, save below 60 %; allowed while tokens remain."""
        elapsed = int(now - self.last_update)
        self.last_update = now
        if usage_percent >= LIMITER_CONSUME_PERCENT:
            self.tokens -= (usage_percent - 100) * elapsed
        elif usage_percent < LIMITER_SAVE_PERCENT:
            self.tokens += (100 - usage_percent) * elapsed
        self.tokens = max(min(self.tokens, self.capacity), -self.capacity)
        return self.tokens > 0

    def expired(self, now: float) -> bool:
        """Not updated for more than 2 × the burst period."""
        return now - self.last_update > self.expire_seconds


@dataclass
class LimiterPool:
    """Limiters by container id; re-created when their capacity changes, dropped when they expire."""

    rand: Callable[[], float] = random.random
    limiters: dict[str, BurstLimiter] = field(default_factory=dict)

    def get(self, key: str, period_seconds: int, percent: int, now: float) -> BurstLimiter:
        """The container's limiter for this config (a new one when absent or the capacity changed)."""
        lim = self.limiters.get(key)
        if lim is None or lim.capacity != period_seconds * (percent - 100):
            lim = self.limiters[key] = BurstLimiter.new(period_seconds, percent, now, self.rand)
        return lim

    def recycle(self, now: float) -> list[str]:
        """Drop expired limiters; returns their keys."""
        gone = [k for k, lim in self.limiters.items() if lim.expired(now)]
        for k in gone:
            del self.limiters[k]
        return gone


def limiter_allows(
    pool: LimiterPool, key: str, cfg: CPUBurstConfig, usage_cores: float | None, limit_milli: int, now: float
) -> bool:
    """The limiter check of one container (run before the policy check: it updates the bucket)."""
    period = cfg.cfs_quota_burst_period_seconds
    if period is None or period < 0:
        return True
    percent = cfg.cfs_quota_burst_percent
    if percent is None or percent < 100:
        return False
    usage = usage_cores if usage_cores is not None else limit_milli / 1000
    usage_percent = int(usage * 1000 * 100 / limit_milli)
    return pool.get(key, period, percent, now).allow(now, usage_percent)


def decide_quota(
    cfg: CPUBurstConfig,
    node_state: NodeBurstState,
    cur: int,
    limit_milli: int,
    throttled: float | None,
    usage_cores: float | None,
    limiters: LimiterPool,
    key: str,
    now: float,
) -> tuple[Operation, int, bool]:
    """A container's operation, target quota and limiter verdict (limit_milli must be > 0)."""
    base = base_quota(limit_milli)
    if base is None:
        raise ValueError(f"container {key} has no CPU limit")
    allowed = limiter_allows(limiters, key, cfg, usage_cores, limit_milli, now)
    op = apply_node_state(container_operation(cfg.policy, allowed, throttled), node_state)
    return op, target_quota(op, cur, base, ceil_quota(base, cfg.cfs_quota_burst_percent)), allowed


# -- the strategy -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    """The dynamic decision for one container (quota values in µs)."""

    pod: str
    container: str
    op: Operation
    cur: int
    base: int
    ceil: int
    target: int
    reason: str


@dataclass
class RoundReport:
    """What one round saw and did (kept on the strategy as `last`, for tests and inspection)."""

    node_state: NodeBurstState = NodeBurstState.UNKNOWN
    pool: SharePool | None = None
    static: dict[str, int] = field(default_factory=dict)  # dir → burst µs
    decisions: list[QuotaDecision] = field(default_factory=list)
    results: list[WriteResult] = field(default_factory=list)


class CPUBurstStrategy:
    """The CPUBurst strategy as the QoS manager runs it (every --reconcile-interval-seconds)."""

    name = NAME

    def __init__(
        self,
        injectors: Sequence[GreyControlInjector] = (),
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.injectors = list(injectors)
        self.limiters = LimiterPool(rand)
        self.last_state: NodeBurstState | None = None
        self.last: RoundReport | None = None
        self._burst_supported: bool | None = None
        self._burst_capped_at_quota = False

    def enabled(self, config: AgentConfig) -> bool:
        """Gate CPUBurst and a positive reconcile interval."""
        return config.gate(GATE) and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    # -- inputs ---------------------------------------------------------------------------------------------

    def node_state(self, state: NodeState, env: StrategyEnv) -> tuple[NodeBurstState, SharePool | None]:
        """The share-pool state from window averages of node and pod CPU usage."""
        slo = state.node_slo
        cfg = slo.cpu_burst_strategy if slo is not None else None
        threshold = DEFAULT_SHARE_POOL_THRESHOLD_PERCENT
        if cfg is not None and cfg.share_pool_threshold_percent is not None:
            threshold = cfg.share_pool_threshold_percent
        store: MetricStore = env.store
        window = node_window(env.config.qos.reconcile_interval_seconds)
        node_usage = store.avg(MetricKind.NODE_CPU_USAGE, "", window)
        topology = env.services.get("topology")
        cpu_count = len(topology.cpus) if topology is not None else None
        pod_usage: dict[str, float] = {}
        for uid in state.pods:
            v = store.avg(MetricKind.POD_CPU_USAGE, uid, window)
            if v is not None:
                pod_usage[uid] = v
        return node_state_for_burst(threshold, cpu_count, node_usage, state.pods.values(), pod_usage)

    def _burst_file_supported(self, env: StrategyEnv) -> bool:
        layout = env.services.get("cgroup_layout")
        supported = layout is not None and bool(layout.supports(BURST_FILE))
        if not supported and self._burst_supported is not False:
            CPU_BURST_SKIPPED.labels("burst-unsupported").inc()
            log.warning(
                "kernel has no CFS burst file; static CPU burst skipped",
                strategy=NAME,
                resource=BURST_FILE,
                cgroup_root=str(layout.root) if layout is not None else None,
            )
        self._burst_supported = supported
        return supported

    # -- a round --------------------------------------------------------------------------------------------

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """One round: node state, then per burstable active pod the static burst and the quota burst."""
        report = RoundReport()
        self.last = report
        CPU_BURST_SCALED.set(0)
        slo = state.node_slo
        node_cfg = slo.cpu_burst_strategy if slo is not None else None
        if node_cfg is None:
            return
        node_state, pool = self.node_state(state, env)
        report.node_state, report.pool = node_state, pool
        self._record_node_state(env, node_state, pool, node_cfg.share_pool_threshold_percent)
        static_ok = self._burst_file_supported(env)
        now = env.clock()
        for i, pod in enumerate(state.pods.values()):
            if i and i % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if not burstable(pod) or not pod.active:
                continue
            cfg = pod_burst_config(node_cfg, pod, self.injectors)
            if cfg is None:
                continue
            pod_dir = env.pod_dir(pod)
            if pod_dir is None:
                CPU_BURST_SKIPPED.labels("pod-dir").inc()
                env.warn_once(f"{NAME}:pod-dir:{pod.uid}", "pod cgroup dir refused", pod=pod.key, uid=pod.uid)
                continue
            if static_ok:
                await self._apply_static(env, pod, pod_dir, cfg, report)
            await self._apply_quota(env, pod, pod_dir, cfg, node_state, now, report)
        self.limiters.recycle(now)
        CPU_BURST_SCALED.set(sum(1 for d in report.decisions if d.target > d.base))

    def _record_node_state(
        self, env: StrategyEnv, node_state: NodeBurstState, pool: SharePool | None, threshold: int | None
    ) -> None:
        for s in NodeBurstState:
            CPU_BURST_NODE_STATE.labels(s.value).set(1 if s is node_state else 0)
        if node_state is self.last_state:
            return
        why = (
            f"share pool usage {pool.usage:.2f} / {pool.total:.2f} cores = {pool.ratio:.3f}, "
            f"threshold {threshold}%"
            if pool is not None
            else "node CPU usage or CPU count unknown"
        )
        old = self.last_state.value if self.last_state is not None else None
        env.decisions.record(NAME, "node", "node-state", old, node_state.value, why)
        self.last_state = node_state

    def _container_dir(self, env: StrategyEnv, pod_dir: str, c: ContainerInfo) -> str | None:
        layout = env.services.get("cgroup_layout")
        if layout is None or not c.container_id:
            return None
        try:
            return str(layout.container_dir_in(pod_dir, c.container_id))
        except CgroupError as exc:
            CPU_BURST_SKIPPED.labels("container-dir").inc()
            env.warn_once(
                f"{NAME}:container-dir:{c.container_id}",
                "container cgroup dir refused",
                container_id=c.container_id,
                error=str(exc),
            )
            return None

    async def _apply_static(
        self, env: StrategyEnv, pod: PodInfo, pod_dir: str, cfg: CPUBurstConfig, report: RoundReport
    ) -> None:
        executor = env.services.get("executor")
        for attempt in range(2):
            plan = plan_static_burst(
                pod, cfg, lambda c: self._container_dir(env, pod_dir, c), self._burst_capped_at_quota
            )
            writes = [CgroupWrite(d, BURST_FILE, v, Level.CONTAINER) for d, v in plan.containers]
            writes.append(CgroupWrite(pod_dir, BURST_FILE, plan.pod, Level.POD))
            for w in writes:
                report.static[w.parent] = int(w.value)
            if executor is None:
                return
            reason = f"cpuBurst policy {cfg.policy}, cpuBurstPercent {cfg.cpu_burst_percent}"
            if self._burst_capped_at_quota:
                reason += ", capped at the quota (kernel refuses a larger burst)"
            results = await executor.apply_sequential(NAME, writes, reason)
            report.results += results
            if attempt or self._burst_capped_at_quota or all(r.ok for r in results):
                return
            # The first refused burst on this kernel: mainline rejects burst > quota. From now on every
            # burst is capped at the base quota (said once), and this pod is retried right away.
            self._burst_capped_at_quota = True
            CPU_BURST_SKIPPED.labels("burst-capped-at-quota").inc()
            log.warning(
                "kernel refused a CFS burst above the quota; capping bursts at the base quota from now on",
                pod=pod.key,
                errors=[r.error for r in results if not r.ok][:3],
            )

    async def _apply_quota(
        self,
        env: StrategyEnv,
        pod: PodInfo,
        pod_dir: str,
        cfg: CPUBurstConfig,
        node_state: NodeBurstState,
        now: float,
        report: RoundReport,
    ) -> None:
        executor = env.services.get("executor")
        if executor is None:
            return
        store: MetricStore = env.store
        for c in pod.containers:
            if c.state != "running":
                continue
            limit = c.limits.get("cpu", 0)
            base = base_quota(limit)
            if base is None:
                continue
            cdir = self._container_dir(env, pod_dir, c)
            if cdir is None:
                continue
            cur = executor.read_value(cdir, QUOTA_FILE)
            if not isinstance(cur, int):
                CPU_BURST_SKIPPED.labels("quota-unreadable").inc()
                continue
            ceil = ceil_quota(base, cfg.cfs_quota_burst_percent)
            usage = store.last(MetricKind.CONTAINER_CPU_USAGE, c.container_id)
            throttled = store.last(MetricKind.CONTAINER_CPU_THROTTLED, c.container_id)
            op, target, allowed = decide_quota(
                cfg, node_state, cur, limit, throttled, usage, self.limiters, c.container_id, now
            )
            reason = (
                f"{op.value}: node {node_state.value}, policy {cfg.policy}, "
                f"throttled {'n/a' if throttled is None else f'{throttled:.3f}'}"
                f"{'' if allowed else ', burst limiter exhausted'}, quota range [{base}, {ceil}]"
            )
            decision = QuotaDecision(pod.key, c.name, op, cur, base, ceil, target, reason)
            report.decisions.append(decision)
            CPU_BURST_OPERATIONS.labels(op.value).inc()
            if target == cur:
                env.decisions.record(NAME, f"{cdir}/{QUOTA_FILE}", op.value, cur, target, reason, quiet=True)
                continue
            pod_cur = executor.read_value(pod_dir, QUOTA_FILE)
            if not isinstance(pod_cur, int):
                CPU_BURST_SKIPPED.labels("pod-quota-unreadable").inc()
                continue
            writes = quota_writes(pod_dir, cdir, pod_cur, cur, target - cur)
            report.results += await executor.apply_sequential(NAME, writes, reason)
