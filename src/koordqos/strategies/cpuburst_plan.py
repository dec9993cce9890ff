"""CPUBurst planning (docs/behaviour-qos-manager.md, "CPU burst"), pure: config merge, node state, static
burst and dynamic quota decisions.

Static: a CFS burst budget of `cpuBurstPercent` of the CPU limit. Dynamic: the container's CFS quota grows
×1.2 per round while throttled and shrinks ×0.8 while the shared CPU pool is overloaded (or the container's
burst limiter, `cpuburst_limiter.py`, runs dry), always within [base, base × cfsQuotaBurstPercent].
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.model.nodeslo import CPUBurstConfig, merge_pod_cpu_burst
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import QoSClass
from koordqos.strategies.cpuburst_limiter import LimiterPool, limiter_allows

CFS_PERIOD = 100_000  # µs, CFS base period
MIN_QUOTA = 1000  # µs, the kernel's smallest quota
SCALE_UP_RATIO = 1.2
SCALE_DOWN_RATIO = 0.8
COOLING_RATIO = 0.9  # cooling band: threshold × 0.9 ≤ ratio < threshold
NODE_WINDOW_INTERVALS = 5
NODE_WINDOW_MAX_SECONDS = 10.0

# NodeSLO defaults (a merged NodeSLO always carries them; these cover a config built by hand)
DEFAULT_CPU_BURST_PERCENT = 1000
DEFAULT_SHARE_POOL_THRESHOLD_PERCENT = 50

BURST_FILE = "cpu.cfs_burst_us"
QUOTA_FILE = "cpu.cfs_quota_us"


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


def limiter_enabled(cfg: CPUBurstConfig) -> bool:
    """The burst limiter counts usage: cfsQuotaBurstPeriodSeconds >= 0 and cfsQuotaBurstPercent >= 100."""
    period, percent = cfg.cfs_quota_burst_period_seconds, cfg.cfs_quota_burst_percent
    return period is not None and period >= 0 and percent is not None and percent >= 100


def reads_container_cpu(pod: PodInfo, node_cfg: CPUBurstConfig | None) -> bool:
    """Whether a CPUBurst round reads `pod`'s containers' CPU usage or throttling (the metrics collector
    reads them only then, `--container-metrics=needed`).

    A round looks at burstable active pods when the NodeSLO has a cpuBurstStrategy, and reads a running
    container's series only when it has a CPU limit: throttling when the pod's effective policy bursts the
    quota (auto, cfsQuotaBurstOnly), usage then and whenever the burst limiter is on (whatever the policy: it
    keeps counting). Grey-control injectors are not consulted (none is built by the agent).
    """
    if node_cfg is None or not burstable(pod) or not pod.active:
        return False
    if not any(c.limits.get("cpu", 0) > 0 for c in pod.containers):
        return False
    cfg = pod_burst_config(node_cfg, pod)
    return cfg is not None and (cfs_quota_burst_enabled(cfg.policy) or limiter_enabled(cfg))


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


PoolEntry = tuple[str, float | None]  # (pod uid, CPU request in cores for LSE/LSR, None for BE)


def pool_entries(pods: Iterable[PodInfo]) -> list[PoolEntry]:
    """What the share pool needs of each LSE, LSR and BE pod, in order (pods of other classes left out):
    it depends on the pods alone, so a caller keeps it while the pods do not change."""
    out: list[PoolEntry] = []
    for pod in pods:
        qos = pod.qos_raw
        if qos in (QoSClass.LSE, QoSClass.LSR):
            out.append((pod.uid, pod.request("cpu") / 1000))
        elif qos is QoSClass.BE:
            out.append((pod.uid, None))
    return out


def share_pool_of(
    cpu_count: int, node_usage: float, entries: Iterable[PoolEntry], pod_usage: Mapping[str, float]
) -> SharePool:
    """`share_pool` from `pool_entries` (the same arithmetic, in the same order)."""
    total = float(cpu_count)
    usage = node_usage
    for uid, request in entries:
        if request is not None:
            total -= request
        usage -= pod_usage.get(uid, 0.0)
    return SharePool(total, usage)


def share_pool(
    cpu_count: int, node_usage: float, pods: Iterable[PodInfo], pod_usage: Mapping[str, float]
) -> SharePool:
    """Share pool total = CPUs − LSE/LSR requests; usage = node usage − LSE/LSR/BE pod usage (cores)."""
    return share_pool_of(cpu_count, node_usage, pool_entries(pods), pod_usage)


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
    return node_state_of(threshold_percent, cpu_count, node_usage, pool_entries(pods), pod_usage)


def node_state_of(
    threshold_percent: int,
    cpu_count: int | None,
    node_usage: float | None,
    entries: Iterable[PoolEntry],
    pod_usage: Mapping[str, float],
) -> tuple[NodeBurstState, SharePool | None]:
    """`node_state_for_burst` from `pool_entries`."""
    if node_usage is None or not cpu_count:
        return NodeBurstState.UNKNOWN, None
    pool = share_pool_of(cpu_count, node_usage, entries, pod_usage)
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
