"""CPUBurst (docs/behaviour-qos-manager.md, "CPU burst"): let latency-sensitive containers absorb short spikes
instead of being throttled.

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

import errno
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from prometheus_client import Counter, Gauge

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupWrite, Level, Outcome, WriteResult
from koordqos.config import AgentConfig
from koordqos.errors import CgroupError
from koordqos.metrics.types import MetricKind
from koordqos.model.nodeslo import CPUBurstConfig
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.state import NodeState
from koordqos.strategies.cpuburst_limiter import LimiterPool
from koordqos.strategies.cpuburst_plan import (
    BURST_FILE,
    DEFAULT_SHARE_POOL_THRESHOLD_PERCENT,
    QUOTA_FILE,
    GreyControlInjector,
    NodeBurstState,
    Operation,
    PoolEntry,
    SharePool,
    base_quota,
    burstable,
    ceil_quota,
    cfs_quota_burst_enabled,
    decide_quota,
    node_state_of,
    node_window,
    plan_static_burst,
    pod_burst_config,
    pool_entries,
    quota_writes,
)
from koordqos.strategies.framework import Pace, StrategyEnv

log = structlog.get_logger("koordqos.strategies.cpuburst")

NAME = "CPUBurst"
GATE = "CPUBurst"
# a round yields to the loop after this much time in one synchronous slice (hundreds of pods with burst)
YIELD_AFTER_SECONDS = 0.002
# the synchronous parts over every pod (the candidates when the pods changed, the share pool's usage every
# round) are generators that stop this often, so that the round can give the loop a turn between them
PODS_PER_STEP = 64
# Pods whose policy has no dynamic part (`none`, `cpuBurstOnly`) are settled after one clean round: their
# static burst and base quota follow from the pod and the config alone, so they are visited again only when
# either changes, or in the full pass this often (a quota changed behind our back is reset within it; the
# executor's --resource-force-update-seconds re-asserts cached writes on the same period).
FULL_PASS_SECONDS = 60.0

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


BurstState = tuple[NodeBurstState, SharePool | None]  # the node state and the share pool it came from


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
        # the round's pods: (pods mapping, node config) → [(pod, effective config)] of burstable active pods
        self._candidates_for: tuple[Mapping[str, PodInfo], CPUBurstConfig] | None = None
        self._candidates: list[tuple[PodInfo, CPUBurstConfig]] = []
        self._pool: list[PoolEntry] = []  # the candidates' companions for the share pool (LSE, LSR, BE)
        # uid → (pod, node config, effective config): the merge is pydantic work, done once per pod object
        self._configs: dict[str, tuple[PodInfo, CPUBurstConfig, CPUBurstConfig | None]] = {}
        # uid → (pod, effective config, capped) of pods without a dynamic policy whose last visit was clean
        self._settled: dict[str, tuple[PodInfo, CPUBurstConfig, bool]] = {}
        self._next_full_pass = float("-inf")
        # the candidates still to visit each round (dynamic or not yet settled), and the list they came from
        self._todo: list[tuple[PodInfo, CPUBurstConfig]] = []
        self._todo_from: list[tuple[PodInfo, CPUBurstConfig]] | None = None
        self.visited = 0  # pods visited in the last round (for tests and the benchmark)

    def enabled(self, config: AgentConfig) -> bool:
        """Gate CPUBurst and a positive reconcile interval."""
        return config.gate(GATE) and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    # -- inputs ---------------------------------------------------------------------------------------------

    def node_state(self, state: NodeState, env: StrategyEnv) -> BurstState:
        """The share-pool state from window averages of node and pod CPU usage."""
        return _drain(self.node_state_steps(state, env))

    def node_state_steps(self, state: NodeState, env: StrategyEnv) -> Iterator[BurstState | None]:
        """`node_state` in slices: yields None after every PODS_PER_STEP pool pods (the window average of
        each one's usage is looked up every round), then the result."""
        slo = state.node_slo
        cfg = slo.cpu_burst_strategy if slo is not None else None
        threshold = DEFAULT_SHARE_POOL_THRESHOLD_PERCENT
        if cfg is not None and cfg.share_pool_threshold_percent is not None:
            threshold = cfg.share_pool_threshold_percent
        store = env.store
        window = node_window(env.config.qos.reconcile_interval_seconds)
        node_usage = store.avg(MetricKind.NODE_CPU_USAGE, "", window)
        cpu_count = env.cpu_count()
        # only LSE, LSR and BE pods count in the share pool: their usage is all that is looked up; what the
        # pool needs of each pod besides its usage is kept per pods mapping
        known = self._candidates_for
        fresh = known is not None and known[0] is state.pods
        entries = self._pool if fresh else pool_entries(state.pods.values())
        pod_usage: dict[str, float] = {}
        avg = store.avg
        kind = MetricKind.POD_CPU_USAGE
        for i, (uid, _) in enumerate(entries, 1):
            v = avg(kind, uid, window)
            if v is not None:
                pod_usage[uid] = v
            if i % PODS_PER_STEP == 0:
                yield None
        yield node_state_of(threshold, cpu_count, node_usage, entries, pod_usage)

    def _pod_config(self, pod: PodInfo, node_cfg: CPUBurstConfig) -> CPUBurstConfig | None:
        if not self.injectors:  # an injector may answer differently over time: never memoised
            known = self._configs.get(pod.uid)
            if known is not None and known[0] is pod and known[1] is node_cfg:
                return known[2]
        cfg = pod_burst_config(node_cfg, pod, self.injectors)
        self._configs[pod.uid] = (pod, node_cfg, cfg)
        return cfg

    def candidates(self, state: NodeState, node_cfg: CPUBurstConfig) -> list[tuple[PodInfo, CPUBurstConfig]]:
        """Burstable active pods with their effective config; rebuilt only when the pods or the config
        changed (NodeState replaces its pods mapping on every change)."""
        for _ in self.candidate_steps(state, node_cfg):
            pass
        return self._candidates

    def candidate_steps(self, state: NodeState, node_cfg: CPUBurstConfig) -> Iterator[None]:
        """`candidates` in slices: when they are rebuilt, stops after every PODS_PER_STEP pods."""
        known = self._candidates_for
        if (
            known is not None
            and not self.injectors
            and known[0] is state.pods
            and (known[1] is node_cfg or known[1] == node_cfg)
        ):
            return
        if known is not None and known[1] is not node_cfg and known[1] == node_cfg:
            node_cfg = known[1]  # an equal config (a re-sent NodeSLO) keeps the memoised merges valid
        out: list[tuple[PodInfo, CPUBurstConfig]] = []
        pool: list[PodInfo] = []  # the candidates' companions for the share pool (LSE, LSR, BE)
        pods = state.pods
        for i, pod in enumerate(pods.values(), 1):
            if i % PODS_PER_STEP == 0:
                yield
            if not burstable(pod):
                pool.append(pod)
                continue
            if not pod.active:
                continue
            cfg = self._pod_config(pod, node_cfg)
            if cfg is not None:
                out.append((pod, cfg))
        if len(self._configs) > len(pods):
            self._configs = {u: v for u, v in self._configs.items() if u in pods}
        if len(self._settled) > len(pods):
            self._settled = {u: v for u, v in self._settled.items() if u in pods}
        self._candidates_for = (pods, node_cfg)
        self._candidates = out
        self._pool = pool_entries(pool)

    def _burst_file_supported(self, env: StrategyEnv) -> bool:
        supported = env.layout.supports(BURST_FILE)
        if not supported and self._burst_supported is not False:
            CPU_BURST_SKIPPED.labels("burst-unsupported").inc()
            log.warning(
                "kernel has no CFS burst file; static CPU burst skipped",
                strategy=NAME,
                resource=BURST_FILE,
                cgroup_root=str(env.layout.root),
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
        pace = Pace(YIELD_AFTER_SECONDS)
        for _ in self.candidate_steps(state, node_cfg):
            await pace()
        candidates = self._candidates
        node_state: NodeBurstState = NodeBurstState.UNKNOWN
        pool: SharePool | None = None
        for step in self.node_state_steps(state, env):
            if step is None:
                await pace()
            else:
                node_state, pool = step
        report.node_state, report.pool = node_state, pool
        self._record_node_state(env, node_state, pool, node_cfg.share_pool_threshold_percent)
        static_ok = self._burst_file_supported(env)
        now = env.clock()
        full = now >= self._next_full_pass
        if full:
            self._next_full_pass = now + FULL_PASS_SECONDS
            self._settled.clear()
        self.visited = 0
        if self._todo_from is not candidates or full:
            # the pods to look at: dynamic ones always, the others until their visit was clean
            self._todo = candidates
            self._todo_from = candidates
        todo: list[tuple[PodInfo, CPUBurstConfig]] = []
        capped = self._burst_capped_at_quota
        for pod, cfg in self._todo:
            dynamic = cfs_quota_burst_enabled(cfg.policy)
            if not dynamic:
                settled = self._settled.get(pod.uid)
                if (
                    settled is not None
                    and settled[0] is pod
                    and settled[2] is self._burst_capped_at_quota
                    and (settled[1] is cfg or settled[1] == cfg)
                ):
                    continue  # nothing of this pod can have changed since its last clean visit
            await pace()
            self.visited += 1
            pod_dir = env.pod_dir(pod)
            if pod_dir is None:
                CPU_BURST_SKIPPED.labels("pod-dir").inc()
                env.warn_once(f"{NAME}:pod-dir:{pod.uid}", "pod cgroup dir refused", pod=pod.key, uid=pod.uid)
                continue
            clean = True
            if static_ok:
                clean = await self._apply_static(env, pod, pod_dir, cfg, report)
            clean = await self._apply_quota(env, pod, pod_dir, cfg, node_state, now, report) and clean
            if not dynamic and clean:
                self._settled[pod.uid] = (pod, cfg, self._burst_capped_at_quota)
            else:
                self._settled.pop(pod.uid, None)
                todo.append((pod, cfg))
        self._todo = todo
        if capped is not self._burst_capped_at_quota:
            self._todo_from = None  # bursts are capped from now on: the settled pods need it too
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
        if not c.container_id:
            return None
        try:
            return env.container_dir(pod_dir, c.container_id)
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
    ) -> bool:
        """The pod's static burst writes; True when every write is fine (written, unchanged, cached)."""
        executor = env.executor
        for attempt in range(2):
            plan = plan_static_burst(
                pod, cfg, lambda c: self._container_dir(env, pod_dir, c), self._burst_capped_at_quota
            )
            writes = [CgroupWrite(d, BURST_FILE, v, Level.CONTAINER) for d, v in plan.containers]
            writes.append(CgroupWrite(pod_dir, BURST_FILE, plan.pod, Level.POD))
            for w in writes:
                report.static[w.parent] = int(w.value)
            reason = f"cpuBurst policy {cfg.policy}, cpuBurstPercent {cfg.cpu_burst_percent}"
            if self._burst_capped_at_quota:
                reason += ", capped at the quota (kernel refuses a larger burst)"
            results = await executor.apply_sequential(NAME, writes, reason)
            report.results += results
            ok = _clean(results)
            if attempt or self._burst_capped_at_quota or ok or not _kernel_refused(results):
                return ok
            # The kernel's own EINVAL for a burst (mainline rejects burst > quota), not a refused path or
            # another error: from now on every burst is capped at the base quota (said once), and this pod
            # is retried right away.
            self._burst_capped_at_quota = True
            CPU_BURST_SKIPPED.labels("burst-capped-at-quota").inc()
            log.warning(
                "kernel refused a CFS burst above the quota; capping bursts at the base quota from now on",
                pod=pod.key,
                errors=[r.error for r in results if not r.ok][:3],
            )
        return False

    async def _apply_quota(
        self,
        env: StrategyEnv,
        pod: PodInfo,
        pod_dir: str,
        cfg: CPUBurstConfig,
        node_state: NodeBurstState,
        now: float,
        report: RoundReport,
    ) -> bool:
        """The containers' quota decisions and writes; True when every read and write went fine."""
        clean = True
        executor, store = env.executor, env.store
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
                clean = False
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
                clean = False
                continue
            writes = quota_writes(pod_dir, cdir, pod_cur, cur, target - cur)
            results = await executor.apply_sequential(NAME, writes, reason)
            report.results += results
            clean = clean and _clean(results)
        return clean


def _drain(steps: Iterator[BurstState | None]) -> BurstState:
    """Run a `node_state_steps` to its end in one go."""
    for step in steps:
        if step is not None:
            return step
    raise AssertionError("node_state_steps ended without a result")


def _kernel_refused(results: Sequence[WriteResult]) -> bool:
    """Whether the kernel itself rejected a burst value (EINVAL on the write)."""
    return any(r.outcome is Outcome.FAILED and r.error_code == errno.EINVAL for r in results)


def _clean(results: Sequence[WriteResult]) -> bool:
    """Every intent landed or already held (a vanished dir may yet appear: not settled)."""
    return all(r.ok and r.outcome is not Outcome.VANISHED for r in results)
