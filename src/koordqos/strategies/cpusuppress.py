"""CPUSuppress (spec §2.1): cap the CPU the besteffort subtree may use (CFS quota or a smaller cpuset).

`suppress = capacity × threshold − non-BE pod usage − non-BE host-app usage − system usage` (milli-CPU),
floored by `cpuSuppressMinPercent`. The `cfsQuota` policy turns it into the besteffort dir's quota (with a
1 % bypass and a 10 %-of-capacity step-up limit); the `cpuset` policy into a set of CPUs picked from the
LSR and LS pools (LSE CPUs never go to BE). When the NodeSLO switch is off, both are recovered.
Pure: `CPUSuppress.plan` turns inputs into `CgroupWrite` intents; the framework reads and writes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from prometheus_client import Gauge

from koordqos.cgroups.executor import CgroupWrite, Level, Outcome, WriteResult
from koordqos.config import AgentConfig
from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.cpuset import format_cpuset
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO, is_feature_disabled
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.observability import REGISTRY
from koordqos.state import NodeState
from koordqos.strategies.cpupick import Processor, pick_be_cpus
from koordqos.strategies.framework import Pace, StrategyEnv
from koordqos.strategies.intents import (
    CFS_QUOTA,
    CPUSET_CPUS,
    REASON_ADJUST_BE_BY_NODE_CPU_USAGE,
    REASON_UPDATE_CPU,
    BEDir,
    level_of,
)
from koordqos.strategies.suppressevents import node_reference, suppress_event
from koordqos.strategies.suppresssamples import FirstSampleWait
from koordqos.strategies.suppresssmoothing import (
    QuotaHysteresis,
    suppress_usage,
    suppress_usage_paced,
    window_samples,
)
from koordqos.strategies.usage import (
    calculate_filter_pods_used,
    cpu_manager_policy,
    non_be_host_app,
    non_be_pod,
    reserved_cpus,
    system_qos_exclusive_cpus,
)

NAME = "BECPUSuppress"  # its koordlet gate (koordlet's strategy: CPUSuppress)
DEFAULT_THRESHOLD_PERCENT = 65
BYPASS_RATIO = 0.01
BE_MIN_CPUSET_CORES = 2
BE_MIN_QUOTA = 2000
BE_MAX_INCREASE_PERCENT = 0.1
UNSET_QUOTA = -1
CFS_PERIOD = 100_000
POD_DEPTH = 1
CONTAINER_DEPTH = 2
# A full round this often: the BE dirs walked again and every write planned and checked against the files
# (between full rounds an unchanged plan writes nothing and the walk follows the BE pods).
FULL_PASS_SECONDS = 60.0

BE_SUPPRESS_LS_USED = Gauge(
    "koordqos_be_suppress_ls_used_cores",
    "Non-BE pod + host-app + system CPU usage seen by CPU suppress",
    registry=REGISTRY,
)
BE_SUPPRESS_CORES = Gauge(
    "koordqos_be_suppress_cores",
    "CPU cores left to best-effort pods by CPU suppress",
    ["policy"],
    registry=REGISTRY,
)


class Policy(StrEnum):
    """cpuSuppressPolicy."""

    CPUSET = "cpuset"
    CFS_QUOTA = "cfsQuota"


class Status(StrEnum):
    """Per-policy state: the policy is actively suppressing, or its cgroups were restored."""

    USING = "using"
    RECOVERED = "recovered"


@dataclass(frozen=True, slots=True)
class HostApp:
    """A host application of the NodeSLO as the usage split needs it."""

    name: str
    non_be: bool


@dataclass(frozen=True, slots=True)
class SuppressConfig:
    """The NodeSLO settings CPU suppress reads (`enable` None: the switch is missing, skip the round)."""

    enable: bool | None
    threshold_percent: int = DEFAULT_THRESHOLD_PERCENT
    min_percent: int | None = None
    policy: Policy = Policy.CPUSET
    host_apps: tuple[HostApp, ...] = ()


@dataclass(frozen=True)
class SuppressInputs:
    """Everything one CPU-suppress round looks at."""

    config: SuppressConfig
    pods: Mapping[str, PodInfo]
    node: NodeInfo | None
    node_used: float | None  # cores, Last; None when the query failed
    pod_used: Mapping[str, float]  # cores by pod uid (only pods with a sample)
    host_app_used: Mapping[str, float]
    processors: Sequence[Processor]
    be_quota: int | None  # current besteffort cpu.cfs_quota_us (None: unreadable)
    be_cpuset: tuple[int, ...] | None  # current besteffort cpuset.cpus (None: unreadable)
    be_dirs: Sequence[BEDir] = ()  # besteffort dir, pod dirs, container dirs in walk order
    pod_dirs: Mapping[str, str] = field(default_factory=dict)  # BE pod uid → its cgroup dir (relative)
    reserved_cpus: frozenset[int] = frozenset()
    system_qos_exclusive: frozenset[int] = frozenset()
    cpu_manager_policy: str = ""
    reserved_milli: int = 0
    be_cpu_manager: bool = False  # gate BECPUManager
    hysteresis_percent: float = 0.0  # --cpu-suppress-hysteresis-percent (0: koordlet's 1 % bypass only)
    tighten_milli: int = 0  # held below the target by this much, not below the floor (the PSI rule)
    awaiting_sample: tuple[
        str, ...
    ] = ()  # running BE pods whose first CPU sample is to come (suppresssamples)


# -- pure calculations ---------------------------------------------------------------------------------------


def be_suppress_milli(
    capacity_milli: int,
    threshold_percent: int,
    pod_non_be: float,
    host_app_non_be: float,
    system: float,
    min_percent: int | None = None,
) -> int:
    """calculateBESuppressCPU: capacity × threshold − non-BE pods − non-BE host apps − system, min floor."""
    suppress = (
        capacity_milli * threshold_percent // 100
        - int(pod_non_be * 1000)
        - int(host_app_non_be * 1000)
        - int(system * 1000)
    )
    if min_percent is not None:
        suppress = max(suppress, capacity_milli * min_percent // 100)
    return suppress


def suppress_floor(capacity_milli: int, cfg: SuppressConfig) -> int:
    """The least BE suppress can go to: the NodeSLO's minimum, else the policy's floor (the minimum quota;
    BE_MIN_CPUSET_CORES CPUs)."""
    policy_floor = (
        BE_MIN_QUOTA * 1000 // CFS_PERIOD if cfg.policy is Policy.CFS_QUOTA else BE_MIN_CPUSET_CORES * 1000
    )
    if cfg.min_percent is not None:
        return max(policy_floor, capacity_milli * cfg.min_percent // 100)
    return policy_floor


def quota_target(suppress_milli: int) -> int:
    """The quota for a suppress amount before the bypass and step limits: milli × 100, at least 2000."""
    return max(_div_trunc(suppress_milli * CFS_PERIOD, 1000), BE_MIN_QUOTA)


def plan_cfs_quota(suppress_milli: int, current_quota: int, capacity_milli: int) -> int | None:
    """adjustByCfsQuota: the quota to write, or None when the change is below the 1 % bypass."""
    new = quota_target(suppress_milli)
    cores = math.ceil(capacity_milli / 1000)
    min_delta = cores * CFS_PERIOD * BYPASS_RATIO
    if abs(new - current_quota) < min_delta and new != BE_MIN_QUOTA:
        return None
    max_increase = int(cores * CFS_PERIOD * BE_MAX_INCREASE_PERCENT)
    if new - current_quota > max_increase and current_quota != UNSET_QUOTA:
        new = current_quota + max_increase
    return new


def _div_trunc(a: int, b: int) -> int:
    """Integer division truncating toward zero (Go semantics)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def be_cpu_count(suppress_milli: int, old_len: int, all_processors: int) -> int:
    """CPUs for BE: ceil(milli/1000), at least 2, growing by at most ceil(10 % of CPUs) per round."""
    cpus = math.ceil(suppress_milli / 1000)
    cpus = max(cpus, BE_MIN_CPUSET_CORES)
    max_increase = math.ceil(all_processors * BE_MAX_INCREASE_PERCENT)
    if cpus - old_len > max_increase:
        cpus = old_len + max_increase
    return cpus


def pick_suppressed_cpuset(cpus: int, lsr: Sequence[Processor], ls: Sequence[Processor]) -> list[int] | None:
    """Split `cpus` between the LSR and LS pools in proportion and pick from each; None: both pools empty."""
    if not lsr and not ls:
        return None
    lsr_num = cpus * len(lsr) // (len(lsr) + len(ls))
    return pick_be_cpus(lsr_num, lsr) + pick_be_cpus(cpus - lsr_num, ls)


def cpu_pools(
    processors: Sequence[Processor],
    cpu_qos: Mapping[int, QoSClass],
    excluded: frozenset[int],
) -> tuple[list[Processor], list[Processor]]:
    """(LSR pool, LS pool): non-excluded CPUs bound to LSR pods, and those not bound to LSR or LSE pods."""
    lsr: list[Processor] = []
    ls: list[Processor] = []
    for p in processors:
        if p.cpu_id in excluded:
            continue
        qos = cpu_qos.get(p.cpu_id)
        if qos is QoSClass.LSR:
            lsr.append(p)
        elif qos is not QoSClass.LSE:
            ls.append(p)
    return lsr, ls


def recovery_cpuset(
    processors: Sequence[Processor], excluded: frozenset[int], lse_cpus: frozenset[int]
) -> frozenset[int]:
    """calcBECPUSet: every CPU except system-QoS-exclusive, reserved and LSE-bound ones."""
    return frozenset(p.cpu_id for p in processors) - excluded - lse_cpus


# -- the strategy --------------------------------------------------------------------------------------------


@dataclass
class SuppressPlan:
    """One round's outcome: writes in order, and what was computed (for decisions and tests)."""

    writes: list[CgroupWrite] = field(default_factory=list)
    suppress_milli: int | None = None
    skipped: str = ""
    own_milli: int | None = None  # the target before the PSI rule's tightening
    floor_milli: int = 0  # the least it can be: the NodeSLO's minimum, the quota or cpuset floor


class CPUSuppress:
    """CPU suppress with its per-policy status memory (so recovery of an unused policy is written once)."""

    name = NAME

    def __init__(self) -> None:
        self.statuses: dict[Policy, Status] = {}
        self.hysteresis = QuotaHysteresis()
        # Write groups (a recovery, an applied BE cpuset) whose every write landed, with the inputs they
        # were planned from: planned again only when those inputs change, in a full round, or after a
        # round with a problem (`settle`). Between full rounds a file changed behind our back stays so.
        self.landed: dict[str, object] = {}
        self._pending: dict[str, object] = {}
        self._full = True
        self._cpusets_of: Mapping[str, PodInfo] | None = None
        self._non_be_of: Mapping[str, PodInfo] | None = None
        self._non_be_flags: dict[str, bool] = {}
        self._cpusets: dict[str, frozenset[int]] = {}

    def plan(self, inp: SuppressInputs, full: bool = True) -> SuppressPlan:
        """One round of CPU suppress (or recovery): the cgroup writes to make, in order.

        `full=False` leaves out the write groups that landed from the same inputs before (see `landed`).
        """
        out = SuppressPlan()
        cfg = inp.config
        self._full = full
        self._pending = {}
        pod_cpusets = self._scheduler_cpusets(inp.pods)
        if cfg.enable is None:
            out.skipped = "resourceUsedThresholdWithBE.enable not set"
            return out
        if inp.be_cpu_manager:
            out.writes += self.recover_cfs_quota(inp)
            out.writes += self._recover_cpuset_for_be_cpu_manager(inp, pod_cpusets)
            return out
        if not cfg.enable:
            out.writes += self.recover_cfs_quota(inp)
            out.writes += self._recover_cpuset(inp, pod_cpusets, CONTAINER_DEPTH)
            return out
        if inp.node is None:
            out.skipped = "node unknown"
            return out
        if not inp.pods:
            out.skipped = "no pods"
            return out
        if inp.node_used is None:
            out.skipped = "node cpu usage unavailable"
            return out
        if inp.awaiting_sample:
            # their CPU is in the node's usage but not yet in theirs: it would count as system usage
            waited = inp.awaiting_sample
            out.skipped = (
                f"waiting for the first CPU sample of {len(waited)} BE pods: {', '.join(waited[:3])}"
            )
            return out
        capacity = inp.node.capacity.get("cpu", 0)
        non_be = self.non_be(inp.pods)
        pod_non_be, app_non_be, system = calculate_filter_pods_used(
            inp.node_used,
            inp.reserved_milli / 1000,
            inp.pods,
            inp.pod_used,
            cfg.host_apps,
            inp.host_app_used,
            lambda pod: non_be.get(pod.uid) is not False,
            lambda app: app.non_be,
            lambda app: app.name,
        )
        suppress = be_suppress_milli(
            capacity, cfg.threshold_percent, pod_non_be, app_non_be, system, cfg.min_percent
        )
        BE_SUPPRESS_LS_USED.set(pod_non_be + app_non_be + system)
        out.own_milli, out.floor_milli = suppress, suppress_floor(capacity, cfg)
        if inp.tighten_milli > 0:
            suppress = max(out.floor_milli, suppress - inp.tighten_milli)
        out.suppress_milli = suppress
        if not inp.processors:
            out.skipped = "node cpu info unavailable"
            return out
        if cfg.policy is Policy.CFS_QUOTA:
            out.writes += self.adjust_by_cfs_quota(inp, suppress, capacity)
            self.statuses[Policy.CFS_QUOTA] = Status.USING
            out.writes += self._recover_cpuset(inp, pod_cpusets, CONTAINER_DEPTH)
        else:
            out.writes += self.adjust_by_cpuset(inp, suppress, pod_cpusets)
            self.statuses[Policy.CPUSET] = Status.USING
            out.writes += self.recover_cfs_quota(inp)
        return out

    def settle(self, results: Sequence[WriteResult]) -> None:
        """After the round's writes: its groups (planned or found unchanged) are what landed; after any
        problem (a refused, failed or vanished write) nothing is: the next round plans everything again."""
        # only this round's groups: a group not planned now (the policy moved on) may have been overwritten
        ok = all(r.ok and r.outcome is not Outcome.VANISHED for r in results)
        self.landed = self._pending if ok else {}
        self._pending = {}

    def _unchanged(self, group: str, key: object) -> bool:
        """Whether `group` landed from `key` before (and this is not a full round); else it is pending."""
        self._pending[group] = key
        return not self._full and group in self.landed and self.landed[group] == key

    def non_be(self, pods: Mapping[str, PodInfo]) -> dict[str, bool]:
        """`non_be_pod` of every pod by uid, memoised per pods mapping (1,000 pods: ~1 ms each round)."""
        if self._non_be_of is not pods:
            self._non_be_flags = {uid: non_be_pod(pod) for uid, pod in pods.items()}
            self._non_be_of = pods
        return self._non_be_flags

    def _scheduler_cpusets(self, pods: Mapping[str, PodInfo]) -> dict[str, frozenset[int]]:
        """`scheduler_cpusets`, memoised per pods mapping (NodeState replaces it on every change)."""
        if self._cpusets_of is not pods:
            self._cpusets = scheduler_cpusets(pods)
            self._cpusets_of = pods
        return self._cpusets

    # -- cfs quota -------------------------------------------------------------------------------------------

    def adjust_by_cfs_quota(
        self, inp: SuppressInputs, suppress_milli: int, capacity_milli: int
    ) -> list[CgroupWrite]:
        """Set the besteffort quota to the suppress amount (bypass and step limits applied)."""
        if inp.be_quota is None or not inp.be_dirs:
            return []
        new = plan_cfs_quota(suppress_milli, inp.be_quota, capacity_milli)
        self.hysteresis.percent = inp.hysteresis_percent
        new = self.hysteresis.decide(new, quota_target(suppress_milli), inp.be_quota, capacity_milli)
        if new is None:
            # the cap in force stays: exported too (after a restart over a suppressed node nothing is written)
            if inp.be_quota != UNSET_QUOTA:
                BE_SUPPRESS_CORES.labels(Policy.CFS_QUOTA.value).set(inp.be_quota / CFS_PERIOD)
            return []
        BE_SUPPRESS_CORES.labels(Policy.CFS_QUOTA.value).set(new / CFS_PERIOD)
        return [
            CgroupWrite(
                inp.be_dirs[0].path,
                CFS_QUOTA,
                str(new),
                Level.QOS,
                cacheable=False,
                reason=REASON_ADJUST_BE_BY_NODE_CPU_USAGE,
            )
        ]

    def recover_cfs_quota(self, inp: SuppressInputs) -> list[CgroupWrite]:
        """recoverCFSQuotaIfNeed: write -1 once unless already recovered."""
        if self.statuses.get(Policy.CFS_QUOTA) is Status.RECOVERED or not inp.be_dirs:
            return []
        self.statuses[Policy.CFS_QUOTA] = Status.RECOVERED
        return [
            CgroupWrite(
                inp.be_dirs[0].path,
                CFS_QUOTA,
                str(UNSET_QUOTA),
                Level.QOS,
                cacheable=False,
                reason=REASON_UPDATE_CPU,
            )
        ]

    # -- cpuset ----------------------------------------------------------------------------------------------

    def _excluded(self, inp: SuppressInputs) -> frozenset[int]:
        return inp.reserved_cpus | inp.system_qos_exclusive

    def _lse_cpus(self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]) -> frozenset[int]:
        lse: set[int] = set()
        for uid, cpus in pod_cpusets.items():
            pod = inp.pods.get(uid)
            if pod is not None and pod.qos_raw is QoSClass.LSE:
                lse |= cpus
        return frozenset(lse)

    def be_cpuset(self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]) -> frozenset[int]:
        """The full BE cpuset used for recovery."""
        return recovery_cpuset(inp.processors, self._excluded(inp), self._lse_cpus(inp, pod_cpusets))

    def _recover_cpuset(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]], max_depth: int
    ) -> list[CgroupWrite]:
        """`recover_cpuset` unless the same recovery landed before."""
        if inp.processors:
            value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
            if self._unchanged("recover-cpuset", (max_depth, value, inp.be_dirs)):
                self.statuses[Policy.CPUSET] = Status.RECOVERED
                return []
        return self.recover_cpuset(inp, pod_cpusets, max_depth)

    def _recover_cpuset_for_be_cpu_manager(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """`recover_cpuset_for_be_cpu_manager` unless the same recovery landed before."""
        if inp.processors:
            value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
            bound = tuple(
                sorted(uid for uid in inp.pod_dirs if _bound_by_scheduler(inp.pods.get(uid), pod_cpusets))
            )
            if self._unchanged("recover-cpuset-be-cpu-manager", (value, inp.be_dirs, bound)):
                self.statuses[Policy.CPUSET] = Status.RECOVERED
                return []
        return self.recover_cpuset_for_be_cpu_manager(inp, pod_cpusets)

    def recover_cpuset(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]], max_depth: int
    ) -> list[CgroupWrite]:
        """recoverCPUSetIfNeed: write the full BE cpuset to every BE dir down to `max_depth` (top-down)."""
        self.statuses[Policy.CPUSET] = Status.RECOVERED
        if not inp.processors:
            return []
        value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
        return [
            CgroupWrite(d.path, CPUSET_CPUS, value, level_of(d.depth), reason=REASON_UPDATE_CPU)
            for d in inp.be_dirs
            if d.depth <= max_depth
        ]

    def recover_cpuset_for_be_cpu_manager(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """Full BE cpuset everywhere except containers of pods the scheduler bound to CPUs or NUMA nodes."""
        self.statuses[Policy.CPUSET] = Status.RECOVERED
        if not inp.processors:
            return []
        value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
        bound_dirs = [
            d for uid, d in inp.pod_dirs.items() if _bound_by_scheduler(inp.pods.get(uid), pod_cpusets)
        ]
        writes = []
        for d in inp.be_dirs:
            if d.depth == CONTAINER_DEPTH and any(pd and pd in d.path for pd in bound_dirs):
                continue
            writes.append(
                CgroupWrite(d.path, CPUSET_CPUS, value, level_of(d.depth), reason=REASON_UPDATE_CPU)
            )
        return writes

    def adjust_by_cpuset(
        self, inp: SuppressInputs, suppress_milli: int, pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """Shrink (or grow, step-limited) the BE cpuset to ceil(suppress) CPUs from the LSR and LS pools."""
        if inp.be_cpuset is None:
            return []
        cpu_qos: dict[int, QoSClass] = {}
        for uid, cpus in pod_cpusets.items():
            pod = inp.pods.get(uid)
            if pod is None:
                continue
            for c in cpus:
                cpu_qos[c] = pod.qos_raw
        lsr, ls = cpu_pools(inp.processors, cpu_qos, self._excluded(inp))
        count = be_cpu_count(suppress_milli, len(inp.be_cpuset), len(inp.processors))
        picked = pick_suppressed_cpuset(count, lsr, ls)
        if not picked:
            # no usable CPU (both pools empty, or not enough in a pool): leave the BE cpusets as they are
            return []
        static = inp.cpu_manager_policy == "static"
        recovery = format_cpuset(self.be_cpuset(inp, pod_cpusets)) if static else ""
        key = (tuple(picked), inp.be_cpuset, inp.cpu_manager_policy, recovery, inp.be_dirs)
        if self._unchanged("apply-be-cpuset", key):
            BE_SUPPRESS_CORES.labels(Policy.CPUSET.value).set(len(set(picked)))
            if recovery:
                self.statuses[Policy.CPUSET] = Status.RECOVERED
            return []
        return self.apply_be_cpuset(inp, picked, pod_cpusets)

    def apply_be_cpuset(
        self, inp: SuppressInputs, picked: Sequence[int], pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """applyBESuppressCPUSet: static kubelet policy → containers only; else loosen down, set up."""
        new = format_cpuset(picked)
        BE_SUPPRESS_CORES.labels(Policy.CPUSET.value).set(len(set(picked)))
        reason = REASON_ADJUST_BE_BY_NODE_CPU_USAGE
        if inp.cpu_manager_policy == "static":
            writes = self.recover_cpuset(inp, pod_cpusets, POD_DEPTH)
            writes += [
                CgroupWrite(d.path, CPUSET_CPUS, new, level_of(d.depth), reason=reason)
                for d in inp.be_dirs
                if d.depth == CONTAINER_DEPTH
            ]
            return writes
        dirs = [d for d in inp.be_dirs if d.depth <= CONTAINER_DEPTH]
        merged = format_cpuset(set(inp.be_cpuset or ()) | set(picked))
        writes = [CgroupWrite(d.path, CPUSET_CPUS, merged, level_of(d.depth), reason=reason) for d in dirs]
        writes += [
            CgroupWrite(d.path, CPUSET_CPUS, new, level_of(d.depth), reason=reason) for d in reversed(dirs)
        ]
        return writes


def scheduler_cpusets(pods: Mapping[str, PodInfo]) -> dict[str, frozenset[int]]:
    """Resource-status cpusets by pod uid (malformed annotations are reported by the pod model)."""
    out: dict[str, frozenset[int]] = {}
    for uid, pod in pods.items():
        rs = pod.resource_status
        if rs is not None and rs.cpuset:
            out[uid] = frozenset(rs.cpus)
    return out


def _bound_by_scheduler(pod: PodInfo | None, pod_cpusets: Mapping[str, frozenset[int]]) -> bool:
    if pod is None:
        return False
    rs = pod.resource_status
    return bool(pod_cpusets.get(pod.uid)) or (rs is not None and bool(rs.numa_node_resources))


# -- wiring: NodeSLO and the node into inputs; the round -----------------------------------------------------


def suppress_config(slo: NodeSLO | None) -> SuppressConfig:
    """SuppressConfig from a (merged) NodeSLO; a missing switch gives `enable=None` (skip the round)."""
    disabled, err = is_feature_disabled(slo, "BECPUSuppress")
    if err is not None or slo is None:
        return SuppressConfig(enable=None)
    t = slo.resource_used_threshold_with_be
    assert t is not None  # is_feature_disabled checked it
    threshold = t.cpu_suppress_threshold_percent
    return SuppressConfig(
        enable=not disabled,
        threshold_percent=DEFAULT_THRESHOLD_PERCENT if threshold is None else threshold,
        min_percent=t.cpu_suppress_min_percent,
        policy=Policy(t.cpu_suppress_policy or Policy.CPUSET.value),
        host_apps=tuple(HostApp(a.name, non_be_host_app(a)) for a in slo.host_applications),
    )


def host_app_used(store: MetricStore, slo: NodeSLO | None) -> dict[str, float]:
    """CollectAllHostAppMetricsLast(cpu): cores by NodeSLO host application name; unmeasured ones omitted."""
    out: dict[str, float] = {}
    for app in slo.host_applications if slo is not None else ():
        v = store.last(MetricKind.HOST_APP_CPU_USAGE, app.name)
        if v is not None:
            out[app.name] = v
    return out


def build_inputs(state: NodeState, env: StrategyEnv) -> SuppressInputs:
    """Read what one round needs: metrics (Last window), the BE cgroups, topology and node annotations."""
    store = env.store
    pods = state.pods
    # system usage is smoothed over --cpu-suppress-usage-window-seconds (suppresssmoothing.py)
    samples = window_samples(env.config.qos.cpu_suppress_usage_window_seconds, env.collect_interval)
    node_used, pod_used = suppress_usage(store, pods, samples)
    pod_dirs: dict[str, str] = {}
    for uid, pod in pods.items():
        if pod.kube_qos is KubeQoS.BESTEFFORT:
            d = env.pod_dir(pod)
            if d is not None:
                pod_dirs[uid] = d
    return assemble_inputs(state, env, node_used, pod_used, env.be_cpuset_dirs(CONTAINER_DEPTH), pod_dirs)


def assemble_inputs(
    state: NodeState,
    env: StrategyEnv,
    node_used: float | None,
    pod_used: Mapping[str, float],
    be_dirs: Sequence[BEDir],
    pod_dirs: Mapping[str, str],
    awaiting_sample: tuple[str, ...] = (),
) -> SuppressInputs:
    """SuppressInputs from the usage and BE dirs a caller gathered, plus what state and env give directly."""
    node = state.node
    return SuppressInputs(
        config=suppress_config(state.node_slo),
        pods=state.pods,
        node=node,
        node_used=node_used,
        pod_used=pod_used,
        host_app_used=host_app_used(env.store, state.node_slo),
        processors=env.processors(),
        be_quota=env.be_quota(),
        be_cpuset=env.be_cpuset(),
        be_dirs=be_dirs,
        pod_dirs=pod_dirs,
        reserved_cpus=reserved_cpus(node),
        system_qos_exclusive=system_qos_exclusive_cpus(node),
        cpu_manager_policy=cpu_manager_policy(node),
        reserved_milli=node.reserved()["cpu"] if node is not None else 0,
        be_cpu_manager=env.config.gate("BECPUSuppress") and env.config.gate("BECPUManager"),
        hysteresis_percent=env.config.qos.cpu_suppress_hysteresis_percent,
        tighten_milli=env.tightening.milli,
        awaiting_sample=awaiting_sample,
    )


class CPUSuppressStrategy:
    """The CPUSuppress strategy as the QoS manager runs it."""

    name = NAME

    def __init__(self) -> None:
        self.core = CPUSuppress()
        self.last_plan: SuppressPlan | None = None
        self._events: set[asyncio.Task[bool]] = set()
        self._next_full = float("-inf")
        # BE pods by uid → pod dir, for the pods mapping they were read from
        self._be_pods_of: Mapping[str, PodInfo] | None = None
        self._be_pod_dirs: dict[str, str] = {}
        self._be_key: tuple[tuple[str, tuple[str, ...]], ...] = ()
        # the BE dir walk and the BE pods (uid, container ids) it was made for (None: walk again)
        self._walked_for: tuple[tuple[str, tuple[str, ...]], ...] | None = None
        self._be_dirs: tuple[BEDir, ...] = ()
        self.walks = 0  # BE dir walks made (for tests and the benchmark)
        self.first_samples = FirstSampleWait()

    def enabled(self, config: AgentConfig) -> bool:
        """Gate BECPUSuppress and a positive interval."""
        return config.gate("BECPUSuppress") and config.qos.cpu_suppress_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--cpu-suppress-interval-seconds."""
        return config.qos.cpu_suppress_interval_seconds

    async def inputs(self, state: NodeState, env: StrategyEnv, full: bool) -> SuppressInputs:
        """`build_inputs` for a running strategy: yields in its loops over pods and dirs, and walks the BE
        dirs again only when the BE pods (or their containers) changed, a write found a dir gone, or in a
        full round (a dir made or removed behind our back is seen then)."""
        pace = Pace()
        store = env.store
        pods = state.pods
        samples = window_samples(env.config.qos.cpu_suppress_usage_window_seconds, env.collect_interval)
        node_used, pod_used = await suppress_usage_paced(store, pods, samples, pace)
        if self._be_pods_of is not pods:
            pod_dirs: dict[str, str] = {}
            key: list[tuple[str, tuple[str, ...]]] = []
            for uid, pod in pods.items():
                if pod.kube_qos is KubeQoS.BESTEFFORT:
                    key.append((uid, tuple(c.container_id for c in pod.containers)))
                    d = self._be_pod_dirs.get(uid) or env.pod_dir(pod)  # a pod's dir never moves
                    if d is not None:
                        pod_dirs[uid] = d
                await pace()
            self._be_pods_of, self._be_pod_dirs, self._be_key = pods, pod_dirs, tuple(sorted(key))
        if full or self._walked_for != self._be_key:
            self._be_dirs = tuple(await env.be_cpuset_dirs_paced(CONTAINER_DEPTH, pace))
            self._walked_for = self._be_key
            self.walks += 1
        wait = self.first_samples
        wait.rounds = env.config.qos.cpu_suppress_new_pod_wait_rounds
        non_be = self.core.non_be(pods)
        awaiting = wait.waiting(
            pods, lambda pod: non_be.get(pod.uid) is False, pod_used, env.clock(), env.collect_interval
        )
        return assemble_inputs(state, env, node_used, pod_used, self._be_dirs, self._be_pod_dirs, awaiting)

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Plan from the current state and metrics, then write through the executor.

        Every FULL_PASS_SECONDS the round is full: the dirs are walked and every write is planned again, so
        a cpuset changed behind our back is put back within that time (the executor compares with the file).
        """
        now = env.clock()
        full = now >= self._next_full
        if full:
            self._next_full = now + FULL_PASS_SECONDS
        inp = await self.inputs(state, env, full)
        await asyncio.sleep(0)  # the inputs and the plan are two slices
        plan = self.core.plan(inp, full=full)
        self.last_plan = plan
        env.tightening.suppress_milli, env.tightening.floor_milli = plan.own_milli, plan.floor_milli
        await asyncio.sleep(0)  # ... and the plan and the writes
        writes = plan.writes
        if full:  # re-check the files themselves, not the executor's cache of what it wrote
            writes = [replace(w, cacheable=False) for w in writes]
        results = await env.apply(NAME, writes)
        self.core.settle(results)
        if any(r.outcome is Outcome.VANISHED for r in results):
            self._walked_for = None  # a dir went away: walk again next round
        self._post_event(state, env, results)
        # A recovery is remembered as done only once its writes landed: a failed "-1" or full-cpuset write
        # would otherwise leave BE capped at the last suppressed value until the agent restarts.
        for r in results:
            if r.ok:
                continue
            policy = Policy.CFS_QUOTA if r.write.resource == "cpu.cfs_quota_us" else Policy.CPUSET
            if self.core.statuses.get(policy) is Status.RECOVERED:
                self.core.statuses[policy] = Status.USING

    def _post_event(self, state: NodeState, env: StrategyEnv, results: Sequence[WriteResult]) -> None:
        """An Event on the Node when the BE cap moved (posted off the round; rate-limited by the recorder)."""
        recorder, node, be_dir = env.events, state.node, env.be_dir()
        event = suppress_event(results, be_dir) if be_dir is not None else None
        if recorder is None or node is None or event is None:
            return
        task = asyncio.create_task(recorder.record(node_reference(node.name, node.uid), "Normal", *event))
        self._events.add(task)
        task.add_done_callback(self._events.discard)
