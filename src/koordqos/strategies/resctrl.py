"""ResctrlReconcile (qos-manager.md §2.6) and the Resctrl hook's pod groups (runtime-hooks.md §3.8): planner.

Class groups `LSR`, `LS`, `BE` get a schemata from their class's `resctrlQOS` (L3 way range, MBA percent;
a disabled class carries the None template 0–100 % / 100 %) and the threads of the active pods of that class
whose `resctrlQOS.enable` is true. Pods with the `node.koordinator.sh/resctrl` annotation get their own group
`koordlet-<uid>` (only with the `Resctrl` gate) and are never put in a class group; groups of pods that lost
the annotation or are gone are removed. Pure: `plan_resctrl` turns `ResctrlInputs` into a `ResctrlPlan`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from koordqos.model.nodeslo import NodeSLO, ResctrlQOS
from koordqos.model.pod import ANNOTATION_RESCTRL, PodInfo, QoSClass
from koordqos.model.resctrl import (
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

NAME = "ResctrlReconcile"
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
    for group in (GROUP_LSR, GROUP_LS, GROUP_BE):
        cfg = class_config(inp.slo, group)
        if cfg is None:
            continue
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
        if class_group is None:
            continue
        cfg = class_config(inp.slo, class_group)
        if cfg is None or cfg.enable is not True:
            continue
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
