"""CPU suppress, the pure plan: how much CPU the besteffort subtree may use and how to cap it.

`suppress = capacity × threshold − non-BE pod usage − non-BE host-app usage − system usage` (milli-CPU),
floored by `cpuSuppressMinPercent`. The `cfsQuota` policy turns it into the besteffort dir's quota (with a
1 % bypass and a 10 %-of-capacity step-up limit); the `cpuset` policy into a set of CPUs picked from the
LSR and LS pools (LSE CPUs never go to BE). The inputs (`SuppressInputs`), the config, the policies and the
round's outcome (`SuppressPlan`) are plain data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from koordqos.cgroups.executor import CgroupWrite
from koordqos.model.node import NodeInfo
from koordqos.model.pod import PodInfo
from koordqos.model.qos import QoSClass
from koordqos.strategies.cpupick import Processor, pick_be_cpus
from koordqos.strategies.intents import (
    BEDir,
)

DEFAULT_THRESHOLD_PERCENT = 65
BYPASS_RATIO = 0.01
BE_MIN_CPUSET_CORES = 2
BE_MIN_QUOTA = 2000
BE_MAX_INCREASE_PERCENT = 0.1
UNSET_QUOTA = -1
CFS_PERIOD = 100_000
POD_DEPTH = 1
CONTAINER_DEPTH = 2


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


@dataclass
class SuppressPlan:
    """One round's outcome: writes in order, and what was computed (for decisions and tests)."""

    writes: list[CgroupWrite] = field(default_factory=list)
    suppress_milli: int | None = None
    skipped: str = ""
    own_milli: int | None = None  # the target before the PSI rule's tightening
    floor_milli: int = 0  # the least it can be: the NodeSLO's minimum, the quota or cpuset floor
