"""CgroupReconcile (docs/reconcile.md, "Memory QoS"): memory QoS at QoS, pod and container level: planner.

Per pod the class's `memoryQOS` (by QoS class with default; LSE uses LSR) is merged with the pod annotation
`koordinator.sh/memoryQOS` (policy `none` → the None template, `auto` → the class's recommended defaults,
then the pod's own fields). Pod and container dirs get memory.min/low (percent of the request),
containers memory.high (throttling percent between request and limit, page aligned), both the wmark,
priority and OOM knobs, pods the page-cache limit; the kube-QoS dirs get the sums of min/low and the class's
priority knobs. Only resources the kernel offers are planned (the caller detects them once).
The writes form one leveled batch: memory.min/low/high are "mergeable if larger" (the executor loosens
top-down, then writes exact values bottom-up). Pure: `plan_pod` / `plan_qos` return `CgroupWrite` intents.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from prometheus_client import Gauge

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.cgroups.layout import CgroupLayout
from koordqos.errors import KoordQoSError
from koordqos.model.keys import BATCH_MEMORY
from koordqos.model.memoryqos import default_memory_qos, without_invalid_memory_qos
from koordqos.model.nodeslo import NONE_MEMORY_QOS, MemoryQOS, NodeSLO
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.model.quantity import to_int
from koordqos.state import NodeState
from koordqos.strategies.framework import INVALID_CONFIG, StrategyEnv

if TYPE_CHECKING:
    from koordqos.config import AgentConfig

log = structlog.get_logger("koordqos.strategies.memoryqos")

ABSENT_FILES = Gauge(
    "koordqos_qos_absent_files",
    "Files a reconcile strategy does not write because this kernel has none (1 = absent), detected once",
    ["strategy", "resource"],
    registry=obs.REGISTRY,
)

NAME = "CgroupReconcile"
REASON = "UpdateCgroups"
PAGE_SIZE = 4096
UNLIMITED = -1  # rendered as "max" on v2 and 9223372036854775807 on v1

MIN = "memory.min"
LOW = "memory.low"
HIGH = "memory.high"
WMARK_RATIO = "memory.wmark_ratio"
WMARK_SCALE = "memory.wmark_scale_factor"
WMARK_MIN_ADJ = "memory.wmark_min_adj"
PRIORITY = "memory.priority"
USE_PRIORITY_OOM = "memory.use_priority_oom"
OOM_GROUP = "memory.oom.group"
PAGECACHE_ENABLE = "memory.pagecache_limit.enable"
PAGECACHE_SIZE = "memory.pagecache_limit.size"
PAGECACHE_SYNC = "memory.pagecache_limit.sync"
MEMORY_QOS_RESOURCES = (
    MIN,
    LOW,
    HIGH,
    WMARK_RATIO,
    WMARK_SCALE,
    WMARK_MIN_ADJ,
    PRIORITY,
    USE_PRIORITY_OOM,
    OOM_GROUP,
    PAGECACHE_ENABLE,
    PAGECACHE_SIZE,
    PAGECACHE_SYNC,
)
_KUBE_QOS_CLASS = {KubeQoS.GUARANTEED: "LSR", KubeQoS.BURSTABLE: "LS", KubeQoS.BESTEFFORT: "BE"}
NONE_TEMPLATE = MemoryQOS.model_validate({"enable": False, **NONE_MEMORY_QOS})


@dataclass
class PodPlan:
    """One pod's writes (pod and container level), what it adds to its kube-QoS sums, and problems."""

    writes: list[CgroupWrite] = field(default_factory=list)
    min_sum: int | None = None  # None: the merged config has no minLimitPercent
    low_sum: int | None = None
    problems: dict[str, str] = field(default_factory=dict)


def class_memory_qos(slo: NodeSLO | None, qos: str) -> MemoryQOS | None:
    """The `memoryQOS` of a Koordinator class."""
    if slo is None or slo.resource_qos_strategy is None:
        return None
    conf = slo.resource_qos_strategy.for_class(qos)
    return None if conf is None else conf.memory_qos


def merged_memory_qos(pod: PodInfo, slo: NodeSLO | None) -> MemoryQOS | None:
    """The class config by the pod's QoS (with default), with the pod annotation laid over it."""
    cfg = class_memory_qos(slo, pod.qos.value)
    pod_cfg = pod.ext.memory_qos  # an unparsable annotation is reported by the pod model and ignored
    if pod_cfg is None:
        return cfg
    if pod_cfg.policy == "none":
        return NONE_TEMPLATE
    if pod_cfg.policy == "auto":
        auto = default_memory_qos(pod.qos.value)
        if auto is not None:
            enable = None if cfg is None else cfg.enable
            cfg = auto.model_copy(update={"enable": enable})
    overlay = pod_cfg.model_dump(exclude_none=True, exclude={"policy"})
    if not overlay:
        return cfg
    return (cfg or MemoryQOS()).model_copy(update=overlay)


def _pct(value: int, percent: int | None) -> int | None:
    return None if percent is None else value * percent // 100


def _static_knobs(cfg: MemoryQOS, with_wmark: bool) -> list[tuple[str, int | None]]:
    knobs: list[tuple[str, int | None]] = []
    if with_wmark:
        knobs += [
            (WMARK_RATIO, cfg.wmark_ratio),
            (WMARK_SCALE, cfg.wmark_scale_permill),
            (WMARK_MIN_ADJ, cfg.wmark_min_adj),
        ]
    knobs += [
        (PRIORITY, cfg.priority),
        (USE_PRIORITY_OOM, cfg.priority_enable),
        (OOM_GROUP, cfg.oom_kill_group),
    ]
    return knobs


def _pod_request_limit(pod: PodInfo) -> tuple[int, int]:
    """Memory request and limit of a pod (BE: batch-memory; limit −1 when unlimited)."""
    if pod.qos is QoSClass.BE:
        req = pod.request(BATCH_MEMORY)
        limit = pod.limit(BATCH_MEMORY)
    else:
        req = pod.kube_request("memory")
        limit = pod.kube_limit("memory")
    return max(req, 0), limit if limit > 0 else -1


def _container_request_limit(pod: PodInfo, c: ContainerInfo) -> tuple[int, int]:
    res = BATCH_MEMORY if pod.qos is QoSClass.BE else "memory"
    limit = c.limits.get(res, 0)
    return max(c.requests.get(res, 0), 0), limit if limit > 0 else -1


def throttle_high(request: int, limit: int, percent: int, allocatable: int) -> int:
    """memory.high: request + (limit − request) × percent/100, page aligned (node allocatable if no limit)."""
    top = limit if limit > 0 else allocatable
    value = request + (top - request) * percent // 100
    return value // PAGE_SIZE * PAGE_SIZE


def page_cache(cfg: MemoryQOS, pod_limit: int) -> tuple[list[tuple[str, int]], str | None]:
    """Page-cache limit writes of a pod (enable, size, sync) and a problem with the size, if any."""
    size: int | None = None
    if cfg.page_cache_limit_size is not None:
        try:
            size = to_int(cfg.page_cache_limit_size)
        except KoordQoSError as exc:
            return [], f"pageCacheLimitSize: {exc}"
        if size < 0:
            return [], f"pageCacheLimitSize {cfg.page_cache_limit_size} is negative"
        if pod_limit > 0:
            size = min(size, pod_limit)
    elif cfg.page_cache_limit_percent is not None and pod_limit > 0:
        size = pod_limit * cfg.page_cache_limit_percent // 100
    out: list[tuple[str, int]] = []
    enable: int | None = None
    if size is not None:
        enable = 1 if size > 0 else 0
        out.append((PAGECACHE_SIZE, size))
        if size > 0:
            out.append((PAGECACHE_SYNC, 1 if cfg.page_cache_reclaim_sync else 0))
    if cfg.page_cache_enable is not None:
        enable = 1 if cfg.page_cache_enable else 0
    if enable is not None:
        out.insert(0, (PAGECACHE_ENABLE, enable))
    return out, None


def plan_pod(
    pod: PodInfo,
    slo: NodeSLO | None,
    layout: CgroupLayout,
    allocatable_memory: int,
    supported: frozenset[str],
) -> PodPlan:
    """Pod- and container-level writes of one active pod."""
    plan = PodPlan()
    merged = merged_memory_qos(pod, slo)
    if merged is None:
        return plan
    cfg, problems = without_invalid_memory_qos(merged)
    for name, msg in problems.items():
        plan.problems[name] = msg
    try:
        pod_dir = layout.pod_dir(pod)
    except KoordQoSError as exc:
        plan.problems["cgroup"] = str(exc)
        return plan

    def add(parent: str, level: Level, resource: str, value: int | None) -> None:
        if value is not None and resource in supported:
            plan.writes.append(CgroupWrite(parent, resource, value, level))

    req, limit = _pod_request_limit(pod)
    pmin = _pct(req, cfg.min_limit_percent)
    plow = _pct(req, cfg.low_limit_percent)
    plan.min_sum, plan.low_sum = pmin, plow
    if plow is not None and pmin is not None and 0 < plow < pmin:
        plow = pmin
    add(pod_dir, Level.POD, MIN, pmin)
    add(pod_dir, Level.POD, LOW, plow)
    for resource, value in _static_knobs(cfg, with_wmark=True):
        add(pod_dir, Level.POD, resource, value)
    if PAGECACHE_ENABLE in supported or PAGECACHE_SIZE in supported:
        pc, problem = page_cache(cfg, limit)
        if problem:
            plan.problems["page_cache_limit_size"] = problem
        for resource, value in pc:
            add(pod_dir, Level.POD, resource, value)
    for c in pod.containers:
        if not c.container_id:
            continue
        try:
            cdir = layout.container_dir_in(pod_dir, c.container_id)
        except KoordQoSError as exc:
            plan.problems[f"container {c.name}"] = str(exc)
            continue
        creq, climit = _container_request_limit(pod, c)
        cmin = _pct(creq, cfg.min_limit_percent)
        clow = _pct(creq, cfg.low_limit_percent)
        high: int | None = None
        if cfg.throttling_percent is not None:
            if cfg.throttling_percent == 0:
                high = UNLIMITED
            else:
                high = throttle_high(creq, climit, cfg.throttling_percent, allocatable_memory)
        if cmin is not None and clow is not None and 0 < clow < cmin:
            clow = cmin
        if cmin is not None and high is not None and 0 < high < cmin:
            high = cmin
        add(cdir, Level.CONTAINER, MIN, cmin)
        add(cdir, Level.CONTAINER, LOW, clow)
        add(cdir, Level.CONTAINER, HIGH, high)
        for resource, value in _static_knobs(cfg, with_wmark=True):
            add(cdir, Level.CONTAINER, resource, value)
    return plan


def plan_qos(
    slo: NodeSLO | None,
    layout: CgroupLayout,
    sums: Mapping[KubeQoS, tuple[int | None, int | None]],
    supported: frozenset[str],
) -> list[CgroupWrite]:
    """QoS-level writes (Guaranteed = the kubepods root, then Burstable, BestEffort).

    `sums` holds Σ min and Σ low of the active pods of each kube-QoS class (None: no pod set the percent).
    """
    total_min = _sum(s[0] for s in sums.values())
    total_low = _sum(s[1] for s in sums.values())
    out: list[CgroupWrite] = []
    for kq in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT):
        parent = layout.qos_dir(kq)
        qmin, qlow = (total_min, total_low) if kq is KubeQoS.GUARANTEED else sums.get(kq, (None, None))
        values: list[tuple[str, int | None]] = [(MIN, qmin), (LOW, qlow)]
        cfg = class_memory_qos(slo, _KUBE_QOS_CLASS[kq])
        if cfg is not None:
            cfg, _ = without_invalid_memory_qos(cfg)  # the problems are reported per pod
            values += _static_knobs(cfg, with_wmark=False)
        for resource, value in values:
            if value is not None and resource in supported:
                out.append(CgroupWrite(parent, resource, value, Level.QOS))
    return out


def _sum(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def add_sums(sums: dict[KubeQoS, tuple[int | None, int | None]], kube_qos: KubeQoS, pod: PodPlan) -> None:
    """Accumulate a pod's min/low into its kube-QoS class."""
    cur_min, cur_low = sums.get(kube_qos, (None, None))
    sums[kube_qos] = (_sum((cur_min, pod.min_sum)), _sum((cur_low, pod.low_sum)))


@dataclass(frozen=True)
class MemoryQoSPlan:
    """All writes of a round in level order, and problems by pod key."""

    writes: list[CgroupWrite]
    problems: dict[str, dict[str, str]]


def plan_memory_qos(
    pods: Mapping[str, PodInfo],
    slo: NodeSLO | None,
    layout: CgroupLayout,
    allocatable_memory: int,
    supported: frozenset[str],
) -> MemoryQoSPlan:
    """The whole round: QoS level, then every active pod (the executor orders the levels)."""
    sums: dict[KubeQoS, tuple[int | None, int | None]] = {}
    writes: list[CgroupWrite] = []
    problems: dict[str, dict[str, str]] = {}
    for uid in sorted(pods):
        pod = pods[uid]
        if not pod.active:
            continue
        pp = plan_pod(pod, slo, layout, allocatable_memory, supported)
        add_sums(sums, pod.kube_qos, pp)
        writes += pp.writes
        if pp.problems:
            problems[pod.key] = pp.problems
    return MemoryQoSPlan(plan_qos(slo, layout, sums, supported) + writes, problems)


# -- the strategy as the QoS manager runs it -------------------------------------------------------------

YIELD_EVERY_PODS = 10
FULL_PASS_SECONDS = 60.0  # re-apply every pod's writes at least this often (the executor's force-update age)
_RETRY = frozenset({"vanished", "failed", "refused"})


def detect_memory_files(layout: CgroupLayout) -> frozenset[str] | None:
    """Which memory QoS files this kernel has, probed once in the kubepods dir (None: no kubepods dir yet)."""
    try:
        base = layout.subsystem_dir(layout.kubepods_dir(), "memory")
    except KoordQoSError:
        return None
    if not base.is_dir():
        return None
    found = set()
    for name in MEMORY_QOS_RESOURCES:
        try:
            if (base / layout.file_name(name)).exists():
                found.add(name)
        except KoordQoSError:  # no file on this cgroup version
            continue
    return frozenset(found)


class CgroupReconcileStrategy:
    """CgroupReconcile: plans changed pods only; a full pass every minute; absent files never planned."""

    name = NAME

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.supported: frozenset[str] | None = None
        self._memo: dict[str, tuple[PodInfo, PodPlan]] = {}
        self._config: tuple[object, ...] | None = None
        self._qos_writes: list[CgroupWrite] | None = None
        self._last_full = float("-inf")
        self.last_writes = 0  # intents handed to the executor in the last round (bench/tests)

    def enabled(self, config: AgentConfig) -> bool:
        """Gate CgroupReconcile and a positive interval."""
        return config.gate("CgroupReconcile") and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    def _detect(self, layout: CgroupLayout, env: StrategyEnv) -> frozenset[str] | None:
        if self.supported is None:
            found = detect_memory_files(layout)
            if found is None:
                env.warn_once("memoryqos:no-kubepods", "memory QoS waits for the kubepods cgroup")
                return None
            self.supported = found
            absent = [r for r in MEMORY_QOS_RESOURCES if r not in found]
            for r in MEMORY_QOS_RESOURCES:
                ABSENT_FILES.labels(NAME, r).set(0 if r in found else 1)
            log.info("memory QoS files detected", present=sorted(found), absent_not_written=absent)
        return self.supported

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Plan the pods whose inputs changed (all of them once a minute) and apply one leveled batch."""
        layout, executor = env.layout, env.executor
        slo, node = state.node_slo, state.node
        self.last_writes = 0
        if slo is None or slo.resource_qos_strategy is None:
            return
        if node is None or not node.allocatable.get("memory"):
            return
        supported = self._detect(layout, env)
        if supported is None:
            return
        allocatable = node.allocatable["memory"]
        config = (slo, allocatable, supported)
        if self._config is None or self._config[0] is not slo or self._config[1:] != config[1:]:
            self._memo.clear()
            self._config = config
        now = self.clock()
        full = now - self._last_full >= FULL_PASS_SECONDS
        if full:
            self._last_full = now
        sums: dict[KubeQoS, tuple[int | None, int | None]] = {}
        writes: list[CgroupWrite] = []
        owner: dict[str, str] = {}  # pod dir → uid, to retry a pod whose writes did not land
        planned = 0
        for uid, pod in state.pods.items():
            if not pod.active:
                self._memo.pop(uid, None)
                continue
            memo = self._memo.get(uid)
            if memo is not None and memo[0] is pod:
                pp = memo[1]
                if full:
                    writes += pp.writes
            else:
                pp = plan_pod(pod, slo, layout, allocatable, supported)
                self._memo[uid] = (pod, pp)
                writes += pp.writes
                self._report(env, pod, pp)
                planned += 1
                if planned % YIELD_EVERY_PODS == 0:  # a burst of new pods: keep each loop step short
                    await asyncio.sleep(0)
            if pp.writes:
                owner[pp.writes[0].parent] = uid
            add_sums(sums, pod.kube_qos, pp)
        for uid in [u for u in self._memo if u not in state.pods]:
            del self._memo[uid]
        qos = plan_qos(slo, layout, sums, supported)
        if full or qos != self._qos_writes:
            writes = qos + writes
            self._qos_writes = qos
        if not writes:
            return
        self.last_writes = len(writes)
        results = await executor.apply(NAME, writes, REASON)
        for r in results:
            if r.outcome.value in _RETRY:
                for parent, uid in owner.items():
                    if r.write.parent.startswith(parent):
                        self._memo.pop(uid, None)
                if r.write.level is Level.QOS:
                    self._qos_writes = None

    def _report(self, env: StrategyEnv, pod: PodInfo, pp: PodPlan) -> None:
        for key, msg in pp.problems.items():
            INVALID_CONFIG.labels(NAME).inc()
            env.warn_once(
                f"memoryqos:{pod.uid}:{key}:{msg}",
                "memory QoS value rejected, file left unchanged",
                pod=pod.key,
                field=key,
                error=msg,
            )
