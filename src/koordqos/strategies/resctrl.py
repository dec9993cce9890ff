"""ResctrlReconcile (docs/reconcile.md, "Resctrl") and the Resctrl hook's pod groups
(docs/behaviour-runtime-hooks.md, "Resctrl hook"): planner.

Class groups `LSR`, `LS`, `BE` get a schemata from their class's `resctrlQOS` (L3 way range, MBA percent;
a disabled class carries the None template 0–100 % / 100 %) and the threads of the active pods of that class
whose `resctrlQOS.enable` is true. Pods with the `node.koordinator.sh/resctrl` annotation get their own group
`koordlet-<uid>` (only with the `Resctrl` gate) and are never put in a class group; groups of pods that lost
the annotation or are gone are removed. Pure: `plan_resctrl` turns `ResctrlInputs` into a `ResctrlPlan`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.threads import pod_thread_ids
from koordqos.errors import KoordQoSError
from koordqos.host import (
    HostIntent,
    Outcome,
    ResctrlGroupCreate,
    ResctrlGroupRemove,
    ResctrlSchemataWrite,
    ResctrlTasksAdd,
)
from koordqos.host.resctrl import read_group_tasks, read_resctrl, read_vendor
from koordqos.model.keys import ANNOTATION_RESCTRL
from koordqos.model.nodeslo import NodeSLO, ResctrlQOS
from koordqos.model.pod import PodInfo
from koordqos.model.qos import QoSClass
from koordqos.model.resctrl import (
    CLASS_GROUPS,
    GROUP_BE,
    GROUP_LS,
    GROUP_LSR,
    POD_GROUP_PREFIX,
    PodResctrl,
    cat_l3_mask,
    l3_line,
    mb_line,
    mba_value,
    parse_pod_resctrl,
    pod_group,
)
from koordqos.state import NodeState
from koordqos.strategies.framework import INVALID_CONFIG, StrategyEnv

if TYPE_CHECKING:
    from koordqos.config import AgentConfig

log = structlog.get_logger("koordqos.strategies.resctrl")

NAME = "RdtResctrl"  # its koordlet gate (koordlet's strategy: ResctrlReconcile)
REASON_SCHEMATA = "UpdateResctrlSchemata"
REASON_TASKS = "UpdateResctrlTasks"

_GROUP_OF_QOS = {
    QoSClass.LSE: GROUP_LSR,
    QoSClass.LSR: GROUP_LSR,
    QoSClass.LS: GROUP_LS,
    QoSClass.BE: GROUP_BE,
}
_CLASS_OF_GROUP = {GROUP_LSR: "LSR", GROUP_LS: "LS", GROUP_BE: "BE"}


@dataclass(frozen=True, slots=True)
class ResctrlInfo:
    """What the node's resctrl offers: the L3 capacity bitmask, the cache ids, the CPU vendor."""

    cbm: int
    cache_ids: tuple[int, ...]
    vendor: str


@dataclass(frozen=True)
class ResctrlInputs:
    """Everything one round looks at (thread ids are read for the pods that need them, by uid)."""

    slo: NodeSLO | None
    info: ResctrlInfo
    pods: Mapping[str, PodInfo]
    group_tasks: Mapping[str, frozenset[int]]  # group name → ids already in its `tasks`
    pod_threads: Mapping[str, Sequence[int]]  # pod uid → thread ids of its container/sandbox cgroups
    pod_groups: bool = False  # the Resctrl hook gate: pods with the annotation get their own group
    existing_pod_groups: frozenset[str] = frozenset()  # `koordlet-*` dirs present


@dataclass
class ResctrlPlan:
    """Groups to create, schemata to write, task ids to add (sorted), pod groups to remove, problems."""

    create: list[str] = field(default_factory=list)
    schemata: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, list[int]] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)  # key (group or pod) → message


def class_config(slo: NodeSLO | None, group: str) -> ResctrlQOS | None:
    """The `resctrlQOS` of the class a group stands for."""
    if slo is None or slo.resource_qos_strategy is None:
        return None
    conf = slo.resource_qos_strategy.for_class(_CLASS_OF_GROUP[group])
    return None if conf is None else conf.resctrl_qos


def class_schemata(cfg: ResctrlQOS, info: ResctrlInfo) -> tuple[str, str | None]:
    """A class group's schemata (L3 line if the range is set and valid, MB line if the percent is valid)
    and the problem with the range, if any."""
    out = ""
    problem = None
    if cfg.cat_range_start_percent is not None and cfg.cat_range_end_percent is not None:
        try:
            out += l3_line(
                info.cache_ids, cat_l3_mask(info.cbm, cfg.cat_range_start_percent, cfg.cat_range_end_percent)
            )
        except ValueError as exc:
            problem = str(exc)
    mb = mba_value(cfg.mba_percent, info.vendor)
    if mb is not None:
        out += mb_line(info.cache_ids, mb)
    elif cfg.mba_percent is not None:
        problem = (problem + "; " if problem else "") + f"mbaPercent {cfg.mba_percent} not in [1, 100]"
    return out, problem


def pod_resctrl(pod: PodInfo) -> PodResctrl | str | None:
    """The pod's annotation parsed (None: absent; str: why it is invalid)."""
    raw = pod.annotations.get(ANNOTATION_RESCTRL)
    if raw is None:
        return None
    try:
        return parse_pod_resctrl(raw)
    except Exception as exc:  # ModelError; anything odd in the JSON is a bad annotation
        return str(exc)


def plan_resctrl(inp: ResctrlInputs) -> ResctrlPlan:
    """Schemata and task moves for the class groups and (with the hook gate) the pod groups."""
    plan = ResctrlPlan()
    enabled: set[str] = set()
    for group in (GROUP_LSR, GROUP_LS, GROUP_BE):
        cfg = class_config(inp.slo, group)
        if cfg is None:
            continue
        if cfg.enable is True:
            enabled.add(group)
        text, problem = class_schemata(cfg, inp.info)
        if problem:
            plan.problems[group] = problem
        if text:
            plan.schemata[group] = text
    wanted_pod_groups: set[str] = set()
    for uid in sorted(inp.pods):
        pod = inp.pods[uid]
        annotated = ANNOTATION_RESCTRL in pod.annotations
        if not pod.active:
            continue
        if annotated:  # pod-level resctrl: never in a class group
            if not inp.pod_groups:
                continue
            parsed = pod_resctrl(pod)
            if isinstance(parsed, str):
                plan.problems[pod.key] = f"{ANNOTATION_RESCTRL}: {parsed}"
                continue
            assert parsed is not None
            group = pod_group(uid)
            wanted_pod_groups.add(group)
            if group not in inp.existing_pod_groups:
                plan.create.append(group)
            text = parsed.schemata(inp.info.cbm, inp.info.cache_ids, inp.info.vendor)
            if text:
                plan.schemata[group] = text
            _add_tasks(plan, group, inp.pod_threads.get(uid, ()), inp.group_tasks.get(group, frozenset()))
            continue
        class_group = _GROUP_OF_QOS.get(pod.qos)
        if class_group not in enabled:
            continue
        assert class_group is not None
        _add_tasks(
            plan, class_group, inp.pod_threads.get(uid, ()), inp.group_tasks.get(class_group, frozenset())
        )
    if inp.pod_groups:
        plan.remove = sorted(
            g
            for g in inp.existing_pod_groups
            if g.startswith(POD_GROUP_PREFIX) and g not in wanted_pod_groups
        )
    return plan


def _add_tasks(plan: ResctrlPlan, group: str, threads: Sequence[int], present: frozenset[int]) -> None:
    new = [t for t in threads if t not in present]
    if new:
        merged = set(plan.tasks.get(group, ())) | set(new)
        plan.tasks[group] = sorted(merged)


def threads_needed(inp_pods: Mapping[str, PodInfo], slo: NodeSLO | None, pod_groups: bool) -> list[str]:
    """Uids of the pods whose thread ids a round needs (so the reader touches no other pod)."""
    enabled = {g for g in (GROUP_LSR, GROUP_LS, GROUP_BE) if (c := class_config(slo, g)) and c.enable is True}
    out = []
    for uid, pod in inp_pods.items():
        if not pod.active:
            continue
        if ANNOTATION_RESCTRL in pod.annotations:
            if pod_groups:
                out.append(uid)
            continue
        if _GROUP_OF_QOS.get(pod.qos) in enabled:
            out.append(uid)
    return out


# -- the strategy as the QoS manager runs it -------------------------------------------------------------

REAPPLY_SECONDS = 60.0  # unchanged schemata are re-checked against the files this often
THREAD_SWEEP_SECONDS = 10.0  # every pod's threads are re-read at least this often
THREAD_SWEEP_ROUNDS = 10  # … spread over this many rounds
THREAD_SWEEP_MIN_PODS = 20
YIELD_EVERY_PODS = 20
_LANDED = frozenset({Outcome.WRITTEN, Outcome.UNCHANGED, Outcome.DRY_RUN})


class ResctrlReconcileStrategy:
    """ResctrlReconcile (and, with the `Resctrl` gate, the pod groups of the Resctrl hook)."""

    name = NAME

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.vendor: str | None = None
        self.pod_groups = False
        self.unavailable = ""  # why resctrl cannot be used, as last logged
        self._threads_seen: dict[str, tuple[PodInfo, float]] = {}  # uid → (pod as read, when)
        self.sweep_seconds = THREAD_SWEEP_SECONDS
        self._schemata: dict[str, tuple[str, float]] = {}  # group → (schemata that landed, when)
        self.last_plan: ResctrlPlan | None = None

    def enabled(self, config: AgentConfig) -> bool:
        """Gate RdtResctrl and a positive interval (the Resctrl gate adds the pod-level groups)."""
        self.pod_groups = config.gate("Resctrl")
        return config.gate("RdtResctrl") and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    async def _read_threads(self, state: NodeState, layout: CgroupLayout) -> dict[str, list[int]]:
        """Thread ids of new or changed pods now, of the others at least every THREAD_SWEEP_SECONDS.

        Project decision: threads a task in a resctrl group creates inherit the group, so re-reading every
        pod's cgroups every second (koordlet) only finds threads started from outside (exec); a sweep
        spread over THREAD_SWEEP_SECONDS keeps a round's reads bounded at hundreds of pods.
        """
        now = self.clock()
        needed = threads_needed(state.pods, state.node_slo, self.pod_groups)
        due: list[tuple[float, str]] = []
        fresh: list[str] = []
        for uid in needed:
            seen = self._threads_seen.get(uid)
            if seen is None or seen[0] is not state.pods[uid]:
                fresh.append(uid)
            elif now - seen[1] >= self.sweep_seconds:
                due.append((seen[1], uid))
        budget = (
            max(THREAD_SWEEP_MIN_PODS, len(needed) // THREAD_SWEEP_ROUNDS) if self.sweep_seconds else len(due)
        )
        due.sort()
        out: dict[str, list[int]] = {}
        for n, uid in enumerate([*fresh, *(u for _, u in due[:budget])], 1):
            if n % YIELD_EVERY_PODS == 0:  # ~30 µs of reads per pod: keep each loop step short
                await asyncio.sleep(0)
            pod = state.pods[uid]
            with contextlib.suppress(KoordQoSError):
                out[uid] = pod_thread_ids(layout, layout.pod_dir(pod))
            self._threads_seen[uid] = (pod, now)
        if len(self._threads_seen) > len(needed):
            keep = set(needed)
            self._threads_seen = {u: v for u, v in self._threads_seen.items() if u in keep}
        return out

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Check resctrl, create the class groups, write schemata, move new threads, drop stale pod groups."""
        host, layout = env.host, env.layout
        if state.node_slo is None:
            return
        self.sweep_seconds = env.config.qos.resctrl_task_sweep_seconds
        if self.vendor is None:
            self.vendor = read_vendor(env.config.paths.proc_root)
        rs = read_resctrl(env.config.paths.sys_root, self.vendor, with_tasks=False)
        if rs.problem or rs.cbm is None:
            if rs.problem != self.unavailable:  # one line per distinct reason, not one per round
                # most nodes have no RDT mounted and the gate is on by default: news, not a fault
                log.info("resctrl unavailable, strategy idle", reason=rs.problem)
                self.unavailable = rs.problem
            return
        if self.unavailable:
            log.info("resctrl available", cache_ids=list(rs.cache_ids), vendor=rs.vendor)
            self.unavailable = ""
        threads = await self._read_threads(state, layout)
        group_tasks: dict[str, frozenset[int]] = {}
        if threads:  # only then is there anything to compare with the groups' tasks
            group_tasks = read_group_tasks(env.config.paths.sys_root, rs.groups)
        inp = ResctrlInputs(
            state.node_slo,
            ResctrlInfo(rs.cbm, rs.cache_ids, rs.vendor),
            state.pods,
            group_tasks,
            threads,
            self.pod_groups,
            frozenset(g for g in rs.groups if g.startswith(POD_GROUP_PREFIX)),
        )
        plan = plan_resctrl(inp)
        self.last_plan = plan
        for key, msg in plan.problems.items():
            INVALID_CONFIG.labels(NAME).inc()
            env.warn_once(f"resctrl:{key}:{msg}", "resctrl setting rejected", target=key, error=msg)
        intents: list[HostIntent] = [
            ResctrlGroupCreate(g, REASON_SCHEMATA) for g in CLASS_GROUPS if g not in rs.groups
        ]
        intents += [ResctrlGroupCreate(g, REASON_SCHEMATA) for g in plan.create]
        now = self.clock()
        for group, text in plan.schemata.items():
            done = self._schemata.get(group)
            if done is None or done[0] != text or now - done[1] >= REAPPLY_SECONDS:
                intents.append(ResctrlSchemataWrite(group, text, REASON_SCHEMATA))
        intents += [ResctrlTasksAdd(g, tuple(tids), REASON_TASKS) for g, tids in plan.tasks.items()]
        intents += [ResctrlGroupRemove(g, REASON_SCHEMATA) for g in plan.remove]
        for g in plan.remove:
            self._schemata.pop(g, None)
        if not intents:
            return
        results = await host.apply(NAME, intents, REASON_SCHEMATA)
        for r in results:
            if isinstance(r.intent, ResctrlTasksAdd) and r.outcome not in _LANDED:
                for uid in threads:  # the group was not there yet: read these pods again next round
                    self._threads_seen.pop(uid, None)
            if isinstance(r.intent, ResctrlSchemataWrite):
                if r.outcome in _LANDED:
                    self._schemata[r.intent.group] = (r.intent.schemata, now)
                else:  # not there (yet) or refused: try again next round
                    self._schemata.pop(r.intent.group, None)
