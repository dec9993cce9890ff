"""SystemConfigReconcile (docs/reconcile.md, "System config"): sysctls and sched features from
`systemStrategy`: planner.

Each configured value is checked against the kernel's range first; an out-of-range value is reported (one
problem per field) and its file is left unchanged. Optional files (memcg reaper, group identity, idle saver,
page-cache limit, sched_features) are only written where the kernel has them: the caller passes which exist.

Project decision (restore, docs/reconcile.md): koordlet leaves a sysctl at the last value it wrote when the
field is removed from the NodeSLO. koordqos remembers each file's content from before its first write and
writes it back when the field is unset again (`--system-config-restore=false`: koordlet's behaviour).
Pure: `plan_system_config` turns `SysInputs` into `SysWrite` intents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from koordqos.host import SysctlWrite, SysfsWrite
from koordqos.host.sysfs import read_beneath_or_none
from koordqos.model.nodeslo import SystemStrategy
from koordqos.state import NodeState
from koordqos.strategies.framework import INVALID_CONFIG, StrategyEnv

if TYPE_CHECKING:
    from koordqos.config import AgentConfig

log = structlog.get_logger("koordqos.strategies.sysconfig")

NAME = "SystemConfig"  # its koordlet gate (koordlet's strategy: SystemConfigReconcile)
REASON = "UpdateSystemConfig"

MIN_FREE_KBYTES = "proc:sys/vm/min_free_kbytes"
WATERMARK_SCALE_FACTOR = "proc:sys/vm/watermark_scale_factor"
REAP_BACKGROUND = "sys:kernel/mm/memcg_reaper/reap_background"
SCHED_GROUP_IDENTITY = "proc:sys/kernel/sched_group_identity_enabled"
SCHED_IDLE_SAVER_WMARK = "proc:sys/kernel/sched_idle_saver_wmark"
PAGECACHE_LIMIT = "sys:kernel/mm/pagecache_limit/enabled"
SCHED_FEATURES = "sys:kernel/debug/sched_features"

MIN_FREE_KBYTES_RANGE = (10240, 10485760)
WATERMARK_SCALE_RANGE = (10, 400)
ALL_FILES = (
    MIN_FREE_KBYTES,
    WATERMARK_SCALE_FACTOR,
    REAP_BACKGROUND,
    SCHED_GROUP_IDENTITY,
    SCHED_IDLE_SAVER_WMARK,
    PAGECACHE_LIMIT,
)
# files written only when the kernel has them (the two vm sysctls are mainline)
OPTIONAL_FILES = frozenset(ALL_FILES[2:]) | {SCHED_FEATURES}


@dataclass(frozen=True, slots=True)
class SysWrite:
    """Intent: write `value` to host file `target` ("proc:<path under proc root>" or "sys:<path>")."""

    target: str
    value: str
    reason: str = REASON
    cacheable: bool = True


@dataclass(frozen=True)
class SysInputs:
    """One round's inputs."""

    strategy: SystemStrategy | None
    capacity_memory: int | None  # bytes (node capacity); None without a node
    present: frozenset[str]  # which optional targets the kernel has (detected once)
    sched_features: Mapping[str, bool] = field(default_factory=dict)  # current state (sched_features file)
    originals: Mapping[str, str] = field(default_factory=dict)  # content before koordqos first wrote it


@dataclass
class SysPlan:
    """Writes in order, and out-of-range fields (field → message)."""

    writes: list[SysWrite] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    invalid: set[str] = field(default_factory=set)  # targets left unchanged because their value is invalid


def min_free_kbytes(capacity_bytes: int, factor: int) -> int:
    """(capacity in kB) × factor / 10000, integer arithmetic as koordlet."""
    return capacity_bytes // 1024 * factor // 10000


def _in(value: int, lo: int, hi: int) -> bool:
    return lo <= value <= hi


def parse_sched_features(text: str) -> dict[str, bool]:
    """`sched_features` content ("A B NO_C …") → {A: True, B: True, C: False}."""
    out: dict[str, bool] = {}
    for word in text.split():
        if word.startswith("NO_"):
            out[word[3:]] = False
        else:
            out[word] = True
    return out


def plan_system_config(inp: SysInputs) -> SysPlan:
    """The sysctl writes of one round (empty when there is no node, no memory capacity or no strategy)."""
    plan = SysPlan()
    s = inp.strategy
    if inp.capacity_memory is None or inp.capacity_memory <= 0:
        return plan
    wanted: dict[str, str] = {}
    if s is not None:
        if s.min_free_kbytes_factor is not None:
            kb = min_free_kbytes(inp.capacity_memory, s.min_free_kbytes_factor)
            if _in(kb, *MIN_FREE_KBYTES_RANGE):
                wanted[MIN_FREE_KBYTES] = str(kb)
            else:
                plan.invalid.add(MIN_FREE_KBYTES)
                plan.problems["minFreeKbytesFactor"] = (
                    f"factor {s.min_free_kbytes_factor} gives min_free_kbytes {kb}, outside "
                    f"[{MIN_FREE_KBYTES_RANGE[0]}, {MIN_FREE_KBYTES_RANGE[1]}]"
                )
        _ranged(
            plan, wanted, "watermarkScaleFactor", WATERMARK_SCALE_FACTOR, s.watermark_scale_factor, 10, 400
        )
        _ranged(plan, wanted, "memcgReapBackGround", REAP_BACKGROUND, s.memcg_reap_back_ground, 0, 1)
        _ranged(
            plan,
            wanted,
            "schedGroupIdentityEnabled",
            SCHED_GROUP_IDENTITY,
            s.sched_group_identity_enabled,
            0,
            1,
        )
        if s.sched_idle_saver_wmark is not None:
            wanted[SCHED_IDLE_SAVER_WMARK] = str(s.sched_idle_saver_wmark)
        _ranged(plan, wanted, "pageCacheLimitEnabled", PAGECACHE_LIMIT, s.page_cache_limit_enabled, 0, 1)
    for target in ALL_FILES:
        if target in OPTIONAL_FILES and target not in inp.present:
            continue
        value = wanted.get(target)
        if target in plan.invalid:
            continue
        if value is None:
            original = inp.originals.get(target)
            if original is not None:  # the field was removed: put back what was there before us
                plan.writes.append(SysWrite(target, original, "RestoreSystemConfig"))
            continue
        plan.writes.append(SysWrite(target, value))
    if SCHED_FEATURES in inp.present and s is not None and s.sched_features:
        for name in sorted(s.sched_features):
            on = s.sched_features[name]
            if inp.sched_features.get(name) is not on:
                plan.writes.append(
                    SysWrite(SCHED_FEATURES, f"{'' if on else 'NO_'}{name}\n", cacheable=False)
                )
    return plan


def _ranged(
    plan: SysPlan, wanted: dict[str, str], field_name: str, target: str, value: int | None, lo: int, hi: int
) -> None:
    if value is None:
        return
    if _in(value, lo, hi):
        wanted[target] = str(value)
    else:
        plan.invalid.add(target)
        plan.problems[field_name] = f"{field_name} {value} outside [{lo}, {hi}]"


# -- the strategy as the QoS manager runs it -------------------------------------------------------------

REAPPLY_SECONDS = 60.0  # an unchanged plan is re-applied (re-checked against the files) this often


def _intent(w: SysWrite) -> SysctlWrite | SysfsWrite:
    root, _, rel = w.target.partition(":")
    if root == "proc":
        return SysctlWrite(rel.removeprefix("sys/"), w.value, w.reason)
    return SysfsWrite(rel, w.value, w.reason, compare=w.cacheable)


def _root_and_rel(target: str, proc_root: Path, sys_root: Path) -> tuple[Path, str]:
    root, _, rel = target.partition(":")
    return (proc_root if root == "proc" else sys_root), rel


class SystemConfigStrategy:
    """SystemConfigReconcile: optional files detected once; originals kept for the restore; plan cache."""

    name = NAME

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.present: frozenset[str] | None = None
        self.originals: dict[str, str] = {}
        self._last: tuple[list[SysWrite], float] | None = None
        self.last_plan: SysPlan | None = None

    def enabled(self, config: AgentConfig) -> bool:
        """Gate SystemConfig and a positive interval."""
        return config.gate("SystemConfig") and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    def _detect(self, proc_root: Path, sys_root: Path) -> frozenset[str]:
        if self.present is None:
            found = set()
            for target in sorted(OPTIONAL_FILES):
                root, rel = _root_and_rel(target, proc_root, sys_root)
                if read_beneath_or_none(root, rel) is not None:
                    found.add(target)
            self.present = frozenset(found)
            log.info("system config files detected", absent_not_written=sorted(OPTIONAL_FILES - found))
        return self.present

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Plan, remember the files' content before the first change, apply through the host actuator."""
        host = env.host
        if state.node_slo is None:
            return
        proc_root, sys_root = Path(env.config.paths.proc_root), Path(env.config.paths.sys_root)
        present = self._detect(proc_root, sys_root)
        features: dict[str, bool] = {}
        if SCHED_FEATURES in present:
            features = parse_sched_features(read_beneath_or_none(sys_root, SCHED_FEATURES[4:]) or "")
        capacity = None if state.node is None else state.node.capacity.get("memory")
        originals = self.originals if env.config.qos.system_config_restore else {}
        inp = SysInputs(state.node_slo.system_strategy, capacity, present, features, originals)
        plan = plan_system_config(inp)
        self.last_plan = plan
        for key, msg in plan.problems.items():
            INVALID_CONFIG.labels(NAME).inc()
            env.warn_once(
                f"sysconfig:{key}:{msg}", "system config value rejected, file left unchanged", error=msg
            )
        now = self.clock()
        if self._last is not None and self._last[0] == plan.writes and now - self._last[1] < REAPPLY_SECONDS:
            return  # nothing changed: not even a read
        for w in plan.writes:
            if w.reason == REASON and w.target not in self.originals and w.target != SCHED_FEATURES:
                root, rel = _root_and_rel(w.target, proc_root, sys_root)
                original = read_beneath_or_none(root, rel)
                if original is not None and original.strip() != w.value:
                    self.originals[w.target] = original.strip()
        results = await host.apply(NAME, [_intent(w) for w in plan.writes], REASON)
        self._last = (plan.writes, now) if all(r.ok for r in results) else None
