"""Shared eviction selection (docs/behaviour-qos-manager.md, "Eviction"): policy annotation, candidate filters
and sorts, release accounting.

Pure: the pass over tasks (`kill_and_evict_steps`) is a generator that yields `(task, pod)` and is sent
whether the eviction succeeded, so the evictor (the I/O) stays outside. `kill_and_evict` drives it with an
async evict function.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY
from koordqos.model.pod import PodInfo
from koordqos.model.qos import PriorityClass, QoSClass

EVICTED_REASON = "evicted"  # koordlet's EvictedStr: the reason passed to the evictor

ResourceList = Mapping[str, int]  # cpu and batch/mid cpu in milli, memories in bytes
PodResourceFunc = Callable[[PodInfo], ResourceList]


class ReleaseTarget(enum.StrEnum):
    """What a task's `to_release` is measured against; releases accumulate per target across tasks."""

    POD_BATCH_RESOURCE_REQUEST = "podBatchResourceRequest"
    POD_USED = "podUsed"
    POD_RESOURCE_REQUEST = "podResourceRequest"


def task_reason(feature: str) -> str:
    """koordlet's task reason: `trigger by koordlet feature <Feature>`."""
    return "trigger by koordlet feature " + feature


@dataclass(frozen=True)
class EvictTask:
    """One feature's wish: release `to_release` (under `target`) by evicting `pods` in this order."""

    feature: str
    pods: tuple[PodInfo, ...]
    target: ReleaseTarget
    to_release: ResourceList
    pod_resource: PodResourceFunc

    @property
    def reason(self) -> str:
        """The task reason string."""
        return task_reason(self.feature)

    def message(self, pod: PodInfo) -> str:
        """The eviction message koordlet passes with the reason `evicted`."""
        return f"{self.reason}, kill pod: {pod.name}"


# -- resource-list arithmetic --------------------------------------------------------------------------------


def sub_release_no_negative(a: ResourceList | None, b: ResourceList | None) -> dict[str, int]:
    """a − b keeping only resources where a > b (a None → empty)."""
    if not a:
        return {}
    b = b or {}
    return {k: v - b.get(k, 0) for k, v in a.items() if v > b.get(k, 0)}


def merge_by_max(a: ResourceList, b: ResourceList) -> dict[str, int]:
    """Element-wise max of two resource lists."""
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out[k], v) if k in out else v
    return out


def add_resources(a: ResourceList, b: ResourceList) -> dict[str, int]:
    """Element-wise sum of two resource lists."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def has_positive(rl: ResourceList | None) -> bool:
    """At least one positive quantity."""
    return bool(rl) and any(v > 0 for v in rl.values())  # type: ignore[union-attr]


def evict_task_check(task: EvictTask | None, released: ResourceList | None) -> tuple[bool, dict[str, int]]:
    """(satisfied, remainder) of a task given what was released under its target."""
    if task is None or not task.to_release:
        return True, {}
    if released is None:
        return False, dict(task.to_release)
    remainder = sub_release_no_negative(task.to_release, released)
    return not remainder, remainder


# -- pod attributes used by the eviction code ----------------------------------------------------------------


def is_eviction_policy_allowed(feature: str, pod: PodInfo) -> bool:
    """Annotation `koordinator.sh/eviction-policy`: absent → allowed; else a JSON list naming `feature`."""
    return pod.eviction_allowed(feature)


def batch_cpu_request(pod: PodInfo) -> int:
    """Σ container (and native sidecar) batch-cpu requests in milli; negatives ignored."""
    return pod.request(BATCH_CPU)


_EXTENDED = {
    "cpu": {PriorityClass.MID: MID_CPU, PriorityClass.BATCH: BATCH_CPU},
    "memory": {PriorityClass.MID: MID_MEMORY, PriorityClass.BATCH: BATCH_MEMORY},
}
EXTENDED_RESOURCE_CLASS: Mapping[str, PriorityClass] = {
    BATCH_CPU: PriorityClass.BATCH,
    BATCH_MEMORY: PriorityClass.BATCH,
    MID_CPU: PriorityClass.MID,
    MID_MEMORY: PriorityClass.MID,
}


def request_type_and_value(pod: PodInfo, kind: str) -> tuple[str, int]:
    """GetRequestFromPod: koord-mid → mid-<kind>, koord-batch → batch-<kind>, else the standard request."""
    ext = _EXTENDED[kind].get(pod.priority_class)
    if ext is not None:
        return ext, pod.request(ext)
    return kind, pod.kube_request(kind)


def request_from_pod(pod: PodInfo, kind: str) -> dict[str, int]:
    """The pod's request in the resource its priority class is accounted in (`kind` is cpu or memory)."""
    name, value = request_type_and_value(pod, kind)
    return {name: value}


# -- candidates ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodEvictInfo:
    """A candidate with the numbers it is sorted by."""

    pod: PodInfo
    priority: int = 0
    label_priority: int = 0
    eviction_priority: int = 0
    milli_cpu_used: int = 0
    milli_cpu_request: int = 0
    cpu_usage: float = 0.0
    memory_used: int = 0
    memory_request: int = 0


def sort_be_pods_for_cpu(
    pods: Iterable[PodInfo], feature: str, pod_cpu_cores: Mapping[str, float]
) -> list[PodEvictInfo]:
    """BECPUEvict candidates: raw-label BE pods the policy allows; lower priority first, else busier."""
    infos: list[PodEvictInfo] = []
    for pod in pods:
        if pod.qos_raw is not QoSClass.BE or not is_eviction_policy_allowed(feature, pod):
            continue
        used = int(pod_cpu_cores.get(pod.uid, 0.0) * 1000)
        req = batch_cpu_request(pod)
        infos.append(
            PodEvictInfo(
                pod, milli_cpu_used=used, milli_cpu_request=req, cpu_usage=used / req if req > 0 else 0.0
            )
        )

    # Pairwise rule: by spec.priority when both are set and differ, else by CpuUsage descending. Pods
    # without priority compare only by usage, which no sort key expresses; use a comparison.
    return _sorted_by(infos, _be_cpu_less)


def _be_cpu_less(a: PodEvictInfo, b: PodEvictInfo) -> bool:
    pa, pb = a.pod.priority, b.pod.priority
    if pa is None or pb is None or pa == pb:
        return a.cpu_usage > b.cpu_usage
    return pa < pb


def sort_be_pods_for_memory(
    pods: Iterable[PodInfo], feature: str, pod_memory_bytes: Mapping[str, float]
) -> list[PodEvictInfo]:
    """BEMemoryEvict candidates: raw-label BE pods the policy allows, sorted priority > usage > name."""
    infos = [
        PodEvictInfo(pod, memory_used=int(pod_memory_bytes.get(pod.uid, 0.0)))
        for pod in pods
        if pod.qos_raw is QoSClass.BE and is_eviction_policy_allowed(feature, pod)
    ]
    return _sorted_by(infos, _be_memory_less)


def _be_memory_less(a: PodEvictInfo, b: PodEvictInfo) -> bool:
    pa, pb = a.pod.priority, b.pod.priority
    if pa is not None and pb is not None and pa != pb:
        return pa < pb
    if a.memory_used != 0 and b.memory_used != 0:
        return a.memory_used > b.memory_used
    if a.memory_used == 0 and b.memory_used == 0:
        return a.pod.name > b.pod.name
    return b.memory_used == 0


def _sorted_by(
    items: list[PodEvictInfo], less: Callable[[PodEvictInfo, PodEvictInfo], bool]
) -> list[PodEvictInfo]:
    import functools

    def cmp(a: PodEvictInfo, b: PodEvictInfo) -> int:
        if less(a, b):
            return -1
        if less(b, a):
            return 1
        return 0

    return sorted(items, key=functools.cmp_to_key(cmp))


def sort_by_priority(
    pods: Iterable[PodInfo],
    feature: str,
    priority_threshold: int,
    build: Callable[[PodInfo, PodEvictInfo], PodEvictInfo | None],
    sub_key: Callable[[PodEvictInfo], int],
) -> list[PodEvictInfo]:
    """Eviction candidates (docs/behaviour-qos-manager.md): active, policy-allowed, priority ≤ threshold,
    eviction-enabled pods with metrics; lowest first.

    `build` fills the usage/request numbers (returning None drops a pod whose usage is unknown);
    `sub_key` is the feature's tie-breaker, larger first.
    """
    infos: list[PodEvictInfo] = []
    for pod in pods:
        if not pod.active or not pod.eviction_allowed(feature):
            continue
        prio = pod.priority_value
        if prio > priority_threshold or not pod.eviction_enabled:
            continue
        base = PodEvictInfo(
            pod, priority=prio, label_priority=pod.label_priority, eviction_priority=pod.eviction_priority
        )
        info = build(pod, base)
        if info is not None:
            infos.append(info)
    infos.sort(key=lambda i: (i.eviction_priority, i.priority, i.label_priority, -sub_key(i)))
    return infos


# -- the pass over tasks (KillAndEvictPods) ------------------------------------------------------------------


@dataclass
class EvictionOutcome:
    """What one pass released per target, which pods were newly evicted and which were pending release."""

    released: dict[ReleaseTarget, dict[str, int]] = field(default_factory=dict)
    evicted: list[tuple[EvictTask, PodInfo]] = field(default_factory=list)
    pending: list[PodInfo] = field(default_factory=list)
    failed: list[tuple[EvictTask, PodInfo]] = field(default_factory=list)

    @property
    def newly_evicted(self) -> bool:
        """At least one pod was evicted in this pass."""
        return bool(self.evicted)


EvictStep = tuple[EvictTask, PodInfo]


def kill_and_evict_steps(
    tasks: Sequence[EvictTask], is_evicted: Callable[[PodInfo], bool]
) -> Generator[EvictStep, bool, EvictionOutcome]:
    """Walk the tasks in order, yielding each pod to evict; send back whether the eviction succeeded."""
    funcs: dict[ReleaseTarget, list[PodResourceFunc]] = {}
    for task in tasks:
        if has_positive(task.to_release):
            funcs.setdefault(task.target, []).append(task.pod_resource)

    def aggregate(pod: PodInfo) -> dict[ReleaseTarget, dict[str, int]]:
        out: dict[ReleaseTarget, dict[str, int]] = {}
        for target, fs in funcs.items():
            merged: dict[str, int] = {}
            for f in fs:
                merged = merge_by_max(merged, f(pod) or {})
            out[target] = merged
        return out

    outcome = EvictionOutcome()
    released = outcome.released
    chosen: set[str] = set()

    def account(pod: PodInfo) -> None:
        for target, rl in aggregate(pod).items():
            released[target] = add_resources(released.get(target, {}), rl)

    def satisfied(task: EvictTask) -> bool:
        return not sub_release_no_negative(task.to_release, released.get(task.target))

    for task in tasks:
        if satisfied(task):
            continue
        for pod in task.pods:
            if pod.uid in chosen:
                continue
            if is_evicted(pod):
                # Evicted in an earlier round but still present: count it as released, evict nothing new.
                chosen.add(pod.uid)
                outcome.pending.append(pod)
                account(pod)
                if satisfied(task):
                    break
                continue
            ok = yield (task, pod)
            if not ok:
                outcome.failed.append((task, pod))
                continue
            chosen.add(pod.uid)
            outcome.evicted.append((task, pod))
            account(pod)
            if satisfied(task):
                break
    return outcome


async def kill_and_evict(
    tasks: Sequence[EvictTask],
    is_evicted: Callable[[PodInfo], bool],
    evict: Callable[[EvictTask, PodInfo], Awaitable[bool]],
) -> EvictionOutcome:
    """Run `kill_and_evict_steps` with an async evict function."""
    gen = kill_and_evict_steps(tasks, is_evicted)
    try:
        step = next(gen)
        while True:
            step = gen.send(await evict(*step))
    except StopIteration as stop:
        result: EvictionOutcome = stop.value
        return result


def kill_and_evict_sync(
    tasks: Sequence[EvictTask],
    is_evicted: Callable[[PodInfo], bool],
    evict: Callable[[EvictTask, PodInfo], bool],
) -> EvictionOutcome:
    """Run `kill_and_evict_steps` with a synchronous evict function (tests, benchmarks)."""
    gen = kill_and_evict_steps(tasks, is_evicted)
    try:
        step = next(gen)
        while True:
            step = gen.send(evict(*step))
    except StopIteration as stop:
        result: EvictionOutcome = stop.value
        return result
