"""Pod and node views: what strategies and hooks read of a pod, parsed once from raw API dicts.

`parse_pod(raw)` turns a pod JSON dict (as the API server or kubelet sends it) into a `PodInfo` without the
Kubernetes client's typed models. Quantities are integers: `cpu` in milli-cores, memory in bytes, batch/mid
CPU as the integer milli-cores they are on the wire. The classification rules are qos-manager.md §4 and
runtime-hooks.md §6.3; the annotation/label formats are runtime-hooks.md §6.4 and qos-manager.md §3.4.

Typed accessors (`pod.resource_status`, `pod.cpu_qos`, `pod.eviction_priority`, …) parse lazily, once per
PodInfo. A malformed value falls back as the spec says (usually "absent") and is listed in `pod.problems`
(key → message), which is logged and counted once per pod and value (`koordqos_model_errors_total`).
Hooks whose spec says "bad JSON → error" check `pod.problems` for their key.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from koordqos.errors import ModelError
from koordqos.model.cpuset import parse_cpuset
from koordqos.model.node import NodeInfo, parse_node
from koordqos.model.nodeslo import CPUBurstConfig, PodCPUQOSConfig, PodMemoryQOSConfig, format_model_error
from koordqos.model.problems import report_problem
from koordqos.model.quantity import parse_resource_list

LABEL_QOS = "koordinator.sh/qosClass"
LABEL_PRIORITY_CLASS = "koordinator.sh/priority-class"
LABEL_SUB_PRIORITY = "koordinator.sh/priority"
LABEL_EVICTION_ENABLED = "koordinator.sh/eviction-enabled"
LABEL_CORE_SCHED_GROUP_ID = "koordinator.sh/core-sched-group-id"
LABEL_CORE_SCHED_POLICY = "koordinator.sh/core-sched-policy"
LABEL_SKIP_HOOKSERVER = "runtimeproxy.koordinator.sh/skip-hookserver"
ANNOTATION_EVICTION_PRIORITY = "koordinator.sh/eviction-priority"
ANNOTATION_EVICTION_POLICY = "koordinator.sh/eviction-policy"
ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
ANNOTATION_EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
ANNOTATION_CPU_QOS = "koordinator.sh/cpuQOS"
ANNOTATION_MEMORY_QOS = "koordinator.sh/memoryQOS"
ANNOTATION_CPU_BURST = "koordinator.sh/cpuBurst"
ANNOTATION_OOM_SCORE_ADJ = "koordinator.sh/oom-score-adj"
ANNOTATION_OOM_SCORE_ADJ_SPEC = "koordinator.sh/oom-score-adj-spec"
ANNOTATION_RESCTRL = "node.koordinator.sh/resctrl"
ANNOTATION_BLKIO_QOS = "koordinator.sh/blkioQOS"
ANNOTATION_NETWORK_QOS = "koordinator.sh/networkQOS"
ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
ANNOTATION_DOCKER_TYPE = "io.kubernetes.docker.type"
BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"
MID_CPU = "kubernetes.io/mid-cpu"
MID_MEMORY = "kubernetes.io/mid-memory"

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "MID_CPU",
    "MID_MEMORY",
    "ContainerInfo",
    "ContainerResources",
    "KubeQoS",
    "NUMANodeResource",
    "NodeInfo",
    "PodExtensions",
    "PodInfo",
    "PriorityClass",
    "QoSClass",
    "ResourceStatus",
    "compute_kube_qos",
    "parse_node",
    "parse_pod",
    "priority_class_of",
]


class QoSClass(enum.StrEnum):
    """Koordinator QoS class (`koordinator.sh/qosClass`); NONE is the empty string."""

    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"
    NONE = ""


class KubeQoS(enum.StrEnum):
    """Kubernetes QoS class; decides the pod's cgroup parent."""

    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BESTEFFORT = "BestEffort"


class PriorityClass(enum.StrEnum):
    """Koordinator priority class."""

    PROD = "koord-prod"
    MID = "koord-mid"
    BATCH = "koord-batch"
    FREE = "koord-free"
    NONE = ""


_QOS_VALUES = frozenset(q.value for q in QoSClass) - {""}
_PRIORITY_VALUES = frozenset(p.value for p in PriorityClass) - {""}
_KUBE_QOS_VALUES = {q.value: q for q in KubeQoS}


class ContainerInfo(BaseModel):
    """One container of a pod: its runtime id and resources (cpu in milli, memory in bytes)."""

    model_config = ConfigDict(frozen=True)

    name: str
    container_id: str = ""  # as in status: "<runtime>://<id>", "" when not started yet
    requests: Mapping[str, int] = Field(default_factory=dict)
    limits: Mapping[str, int] = Field(default_factory=dict)
    state: str = ""  # "running", "waiting", "terminated" or "" (no status yet)
    sidecar: bool = False  # init container with restartPolicy Always (native sidecar)

    @property
    def runtime_id(self) -> str:
        """The id without the `<runtime>://` prefix ("" when not started)."""
        return self.container_id.partition("://")[2] or self.container_id if self.container_id else ""

    @property
    def runtime(self) -> str:
        """The runtime prefix of the container id (`containerd`, `docker`, `cri-o`, …), "" when unknown."""
        prefix, sep, _ = self.container_id.partition("://")
        return prefix if sep else ""


@dataclass(frozen=True, slots=True)
class NUMANodeResource:
    """One NUMA node of a scheduler allocation (resources in the agent's units)."""

    node: int
    resources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    """Annotation `scheduling.koordinator.sh/resource-status`: the scheduler's cpuset / NUMA allocation."""

    cpuset: str = ""
    numa_node_resources: tuple[NUMANodeResource, ...] = ()

    @property
    def cpus(self) -> tuple[int, ...]:
        """The cpuset as CPU ids (validated at parse time)."""
        return parse_cpuset(self.cpuset)

    @property
    def numa_aware(self) -> bool:
        """Some NUMA node carries a non-zero `cpu` or a positive batch-cpu (runtime-hooks.md §3.3)."""
        return any(
            n.resources.get("cpu", 0) != 0 or n.resources.get(BATCH_CPU, 0) > 0
            for n in self.numa_node_resources
        )


@dataclass(frozen=True, slots=True)
class ContainerResources:
    """One container of `node.koordinator.sh/extended-resource-spec`; None = not given (nil in Go)."""

    requests: Mapping[str, int] | None = None
    limits: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class PodExtensions:
    """Typed views of the pod's Koordinator labels/annotations; malformed ones fall back (see problems)."""

    resource_status: ResourceStatus | None = None
    extended_resource_spec: Mapping[str, ContainerResources] | None = None
    cpu_qos: PodCPUQOSConfig | None = None
    memory_qos: PodMemoryQOSConfig | None = None
    cpu_burst: CPUBurstConfig | None = None
    eviction_enabled: bool = False
    eviction_priority: int = 0
    eviction_policy: frozenset[str] | None = None  # None: annotation absent (every feature allowed)
    oom_score_adj: int | None = None
    oom_score_adj_spec: Mapping[str, int] | None = None
    core_sched_group_id: str = ""
    core_sched_policy: str = ""
    priority_label: int | None = None
    problems: Mapping[str, str] = field(default_factory=dict)


class PodInfo(BaseModel):
    """A pod as the agent sees it."""

    model_config = ConfigDict(frozen=True)

    uid: str
    namespace: str = ""
    name: str = ""
    node_name: str = ""
    labels: Mapping[str, str] = Field(default_factory=dict)
    annotations: Mapping[str, str] = Field(default_factory=dict)
    phase: str = "Running"
    kube_qos: KubeQoS = KubeQoS.BESTEFFORT
    priority: int | None = None
    containers: tuple[ContainerInfo, ...] = ()
    init_containers: tuple[ContainerInfo, ...] = ()
    resource_version: str = ""
    deleting: bool = False
    source: str = "api"  # "api" or "nri" (local mode)
    creation_timestamp: str = ""  # RFC 3339; sorts chronologically as a string
    host_network: bool = False
    runtime_class_name: str = ""
    volumes: Mapping[str, str] = Field(default_factory=dict)  # volume name → PVC claim name ("" if not a PVC)
    parse_problems: Mapping[str, str] = Field(default_factory=dict)  # malformed quantities seen by parse_pod

    @property
    def key(self) -> str:
        """namespace/name."""
        return f"{self.namespace}/{self.name}"

    # -- QoS and priority (qos-manager.md §4) --------------------------------------------------------------

    @property
    def qos_raw(self) -> QoSClass:
        """QoS class from the label only; anything unknown is NONE."""
        value = self.labels.get(LABEL_QOS, "")
        if value in _QOS_VALUES:
            return QoSClass(value)
        return QoSClass.NONE

    @property
    def qos(self) -> QoSClass:
        """QoS class with the Kubernetes-QoS fallback (Guaranteed→LSR, Burstable→LS, BestEffort→BE)."""
        raw = self.qos_raw
        if raw is not QoSClass.NONE:
            return raw
        return _QOS_BY_KUBE[self.kube_qos]

    @property
    def priority_class_raw(self) -> PriorityClass:
        """Priority class from the label, else from spec.priority ranges."""
        label = self.labels.get(LABEL_PRIORITY_CLASS)
        if label is not None:
            if label in _PRIORITY_VALUES:
                return PriorityClass(label)
            return PriorityClass.NONE
        return priority_class_of(self.priority)

    @property
    def priority_class(self) -> PriorityClass:
        """Priority class with the QoS default (SYSTEM/LSE/LSR/LS → prod, BE → batch)."""
        raw = self.priority_class_raw
        if raw is not PriorityClass.NONE:
            return raw
        qos = self.qos
        if qos is QoSClass.BE:
            return PriorityClass.BATCH
        if qos is QoSClass.NONE:
            return PriorityClass.NONE
        return PriorityClass.PROD

    @property
    def priority_value(self) -> int:
        """spec.priority when set and non-zero, else the default value of the class."""
        if self.priority:
            return self.priority
        return PRIORITY_DEFAULT[self.priority_class]

    @property
    def sub_priority(self) -> int:
        """Tie-breaker from label `koordinator.sh/priority` (0 when absent or malformed)."""
        value = self.ext.priority_label
        return 0 if value is None else value

    @property
    def label_priority(self) -> int:
        """Eviction `LabelPriority`: label `koordinator.sh/priority`, else the pod's priority value."""
        value = self.ext.priority_label
        return self.priority_value if value is None else value

    @property
    def terminated(self) -> bool:
        """Phase Succeeded or Failed: cgroups are gone, nothing to do."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def active(self) -> bool:
        """Phase Pending or Running (koordlet `IsPodActive`)."""
        return self.phase in ("Pending", "Running")

    # -- resources -----------------------------------------------------------------------------------------

    def request(self, resource: str) -> int:
        """Σ container and native-sidecar requests of `resource` (milli-cpu / bytes); negatives ignored."""
        total = sum(max(c.requests.get(resource, 0), 0) for c in self.containers)
        return total + sum(max(c.requests.get(resource, 0), 0) for c in self.init_containers if c.sidecar)

    def limit(self, resource: str) -> int:
        """Sum of container (and native sidecar) limits of `resource`; 0 if any of them has none."""
        total = 0
        for c in (*self.containers, *(i for i in self.init_containers if i.sidecar)):
            v = c.limits.get(resource, 0)
            if v <= 0:
                return 0
            total += v
        return total

    def kube_request(self, resource: str) -> int:
        """Kubernetes `PodRequests`: max(containers + sidecars, each init container + earlier sidecars)."""
        return _kube_effective(self, resource, "requests")

    def kube_limit(self, resource: str) -> int:
        """Kubernetes `PodLimits` (0 when a regular container has no limit: unlimited)."""
        if any(c.limits.get(resource, 0) <= 0 for c in self.containers):
            return 0
        return _kube_effective(self, resource, "limits")

    def container(self, name: str) -> ContainerInfo | None:
        """A regular or init container by name."""
        for c in (*self.containers, *self.init_containers):
            if c.name == name:
                return c
        return None

    # -- typed annotations and labels (runtime-hooks.md §6.4, qos-manager.md §3.4) ---------------------------

    @cached_property
    def ext(self) -> PodExtensions:
        """Parsed Koordinator labels/annotations (computed once; problems reported once per pod and value)."""
        return _parse_extensions(self)

    @property
    def problems(self) -> Mapping[str, str]:
        """Malformed labels, annotations or quantities: key → error message."""
        if self.parse_problems:
            return {**self.parse_problems, **self.ext.problems}
        return self.ext.problems

    @property
    def resource_status(self) -> ResourceStatus | None:
        """`scheduling.koordinator.sh/resource-status`; None when absent or malformed."""
        return self.ext.resource_status

    @property
    def cpuset(self) -> str:
        """The scheduler-allocated cpuset from resource-status ("" when none)."""
        rs = self.ext.resource_status
        return rs.cpuset if rs is not None else ""

    @property
    def extended_resource_spec(self) -> Mapping[str, ContainerResources] | None:
        """`node.koordinator.sh/extended-resource-spec` by container name; None when absent or malformed."""
        return self.ext.extended_resource_spec

    @property
    def cpu_qos(self) -> PodCPUQOSConfig | None:
        """`koordinator.sh/cpuQOS`; None when absent or malformed (groupIdentity outside [-1, 2])."""
        return self.ext.cpu_qos

    @property
    def memory_qos(self) -> PodMemoryQOSConfig | None:
        """`koordinator.sh/memoryQOS`; None when absent or malformed (the annotation is then ignored)."""
        return self.ext.memory_qos

    @property
    def cpu_burst(self) -> CPUBurstConfig | None:
        """`koordinator.sh/cpuBurst`; None when absent or malformed (the node config then applies)."""
        return self.ext.cpu_burst

    @property
    def eviction_enabled(self) -> bool:
        """Label `koordinator.sh/eviction-enabled` is exactly "true"."""
        return self.ext.eviction_enabled

    @property
    def eviction_priority(self) -> int:
        """Annotation `koordinator.sh/eviction-priority` (int32, may be negative; missing or invalid → 0)."""
        return self.ext.eviction_priority

    def eviction_allowed(self, feature: str) -> bool:
        """Annotation `koordinator.sh/eviction-policy`: absent → any feature; else exact name in the list."""
        policy = self.ext.eviction_policy
        return policy is None or feature in policy

    @property
    def oom_score_adj(self) -> int | None:
        """`koordinator.sh/oom-score-adj` (pod default); None when absent or malformed."""
        return self.ext.oom_score_adj

    @property
    def oom_score_adj_spec(self) -> Mapping[str, int] | None:
        """`koordinator.sh/oom-score-adj-spec` by container; None when absent or malformed."""
        return self.ext.oom_score_adj_spec

    @property
    def core_sched_group_id(self) -> str:
        """Label `koordinator.sh/core-sched-group-id` ("" when absent)."""
        return self.ext.core_sched_group_id

    @property
    def core_sched_policy(self) -> str:
        """Label `koordinator.sh/core-sched-policy`: "", "none" or "exclusive" (unknown → "")."""
        return self.ext.core_sched_policy

    @property
    def docker_container(self) -> bool:
        """Annotation `io.kubernetes.docker.type` present: container ids are `docker://`."""
        return ANNOTATION_DOCKER_TYPE in self.annotations


_QOS_BY_KUBE: Mapping[KubeQoS, QoSClass] = {
    KubeQoS.GUARANTEED: QoSClass.LSR,
    KubeQoS.BURSTABLE: QoSClass.LS,
    KubeQoS.BESTEFFORT: QoSClass.BE,
}

PRIORITY_RANGES: Mapping[PriorityClass, tuple[int, int]] = {
    PriorityClass.PROD: (9000, 9999),
    PriorityClass.MID: (7000, 7999),
    PriorityClass.BATCH: (5000, 5999),
    PriorityClass.FREE: (3000, 3999),
}
PRIORITY_DEFAULT: Mapping[PriorityClass, int] = {
    PriorityClass.PROD: 9500,
    PriorityClass.MID: 7500,
    PriorityClass.BATCH: 5500,
    PriorityClass.FREE: 3500,
    PriorityClass.NONE: 0,
}


def priority_class_of(priority: int | None) -> PriorityClass:
    """Priority class by spec.priority range; None or out of every range → NONE."""
    if priority is None:
        return PriorityClass.NONE
    for cls, (lo, hi) in PRIORITY_RANGES.items():
        if lo <= priority <= hi:
            return cls
    return PriorityClass.NONE


def _kube_effective(pod: PodInfo, resource: str, attr: str) -> int:
    def val(c: ContainerInfo) -> int:
        values: Mapping[str, int] = c.requests if attr == "requests" else c.limits
        return max(values.get(resource, 0), 0)

    total = sum(val(c) for c in pod.containers)
    sidecars = 0
    init_max = 0
    for c in pod.init_containers:
        if c.sidecar:
            sidecars += val(c)
        else:
            init_max = max(init_max, val(c) + sidecars)
    return max(total + sidecars, init_max)


# -- annotation parsing ------------------------------------------------------------------------------------


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ModelError(f"invalid JSON: {exc}") from None


def parse_resource_status(raw: str) -> ResourceStatus:
    """`scheduling.koordinator.sh/resource-status` JSON → ResourceStatus; ModelError if malformed."""
    doc = _json(raw)
    if not isinstance(doc, dict):
        raise ModelError("expected a JSON object")
    cpuset = doc.get("cpuset") or ""
    if not isinstance(cpuset, str):
        raise ModelError("cpuset must be a string")
    parse_cpuset(cpuset)
    numa: list[NUMANodeResource] = []
    for item in doc.get("numaNodeResources") or []:
        if not isinstance(item, dict) or not isinstance(item.get("node", 0), int):
            raise ModelError("numaNodeResources entries must be objects with an integer node")
        resources, errs = parse_resource_list(item.get("resources") or {})
        if errs:
            raise ModelError("numaNodeResources: " + "; ".join(errs))
        numa.append(NUMANodeResource(int(item.get("node", 0)), resources))
    return ResourceStatus(cpuset, tuple(numa))


def parse_extended_resource_spec(raw: str) -> dict[str, ContainerResources]:
    """`node.koordinator.sh/extended-resource-spec` JSON → {container: ContainerResources}; ModelError."""
    doc = _json(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("containers") or {}, dict):
        raise ModelError('expected {"containers": {"<name>": {"requests": {...}, "limits": {...}}}}')
    out: dict[str, ContainerResources] = {}
    for name, spec in (doc.get("containers") or {}).items():
        if not isinstance(spec, dict):
            raise ModelError(f"containers.{name}: expected an object")
        parts: dict[str, dict[str, int] | None] = {}
        for part in ("requests", "limits"):
            value = spec.get(part)
            if value is None:
                parts[part] = None
                continue
            values, errs = parse_resource_list(value)
            if errs:
                raise ModelError(f"containers.{name}.{part}: " + "; ".join(errs))
            parts[part] = values
        out[str(name)] = ContainerResources(parts["requests"], parts["limits"])
    return out


def parse_eviction_policy(raw: str) -> frozenset[str]:
    """`koordinator.sh/eviction-policy` → allowed feature names; anything but a JSON list → empty."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return frozenset()
    if not isinstance(doc, list):
        return frozenset()
    return frozenset(x for x in doc if isinstance(x, str))


def _model_annotation(cls: type[Any], raw: str) -> Any:
    doc = _json(raw)
    if not isinstance(doc, dict):
        raise ModelError("expected a JSON object")
    try:
        return cls.model_validate(doc)
    except ValidationError as exc:
        raise ModelError(format_model_error(exc)) from None


def _parse_extensions(pod: PodInfo) -> PodExtensions:
    labels, ann = pod.labels, pod.annotations
    problems: dict[str, str] = {}
    values: dict[str, Any] = {}

    qos = labels.get(LABEL_QOS)
    if qos and qos not in _QOS_VALUES:
        problems[LABEL_QOS] = f"unknown QoS class {qos!r} (treated as none)"
    pc = labels.get(LABEL_PRIORITY_CLASS)
    if pc is not None and pc not in _PRIORITY_VALUES:
        problems[LABEL_PRIORITY_CLASS] = f"unknown priority class {pc!r} (treated as none)"
    sub = labels.get(LABEL_SUB_PRIORITY)
    if sub is not None:
        try:
            values["priority_label"] = int(sub)
        except ValueError:
            problems[LABEL_SUB_PRIORITY] = f"not an integer: {sub!r}"

    values["eviction_enabled"] = labels.get(LABEL_EVICTION_ENABLED) == "true"
    ep = ann.get(ANNOTATION_EVICTION_PRIORITY)
    if ep is not None:
        try:
            prio = int(ep)
            if not -(2**31) <= prio < 2**31:
                raise ValueError("out of int32 range")
            values["eviction_priority"] = prio
        except ValueError as exc:
            problems[ANNOTATION_EVICTION_PRIORITY] = f"invalid int32 ({exc}); using 0"
    policy = ann.get(ANNOTATION_EVICTION_POLICY)
    if policy is not None:
        allowed = parse_eviction_policy(policy)
        values["eviction_policy"] = allowed
        if not allowed:
            problems[ANNOTATION_EVICTION_POLICY] = "not a non-empty JSON array of names: no eviction allowed"

    parsers: Sequence[tuple[str, str, Any]] = (
        (ANNOTATION_RESOURCE_STATUS, "resource_status", parse_resource_status),
        (ANNOTATION_EXTENDED_RESOURCE_SPEC, "extended_resource_spec", parse_extended_resource_spec),
        (ANNOTATION_CPU_QOS, "cpu_qos", lambda r: _model_annotation(PodCPUQOSConfig, r)),
        (ANNOTATION_MEMORY_QOS, "memory_qos", lambda r: _model_annotation(PodMemoryQOSConfig, r)),
        (ANNOTATION_CPU_BURST, "cpu_burst", lambda r: _model_annotation(CPUBurstConfig, r)),
        (ANNOTATION_OOM_SCORE_ADJ_SPEC, "oom_score_adj_spec", _parse_oom_spec),
    )
    for key, attr, parser in parsers:
        raw = ann.get(key)
        if raw is None or (raw == "" and key != ANNOTATION_RESOURCE_STATUS):
            continue
        try:
            values[attr] = parser(raw)
        except ModelError as exc:
            problems[key] = str(exc)

    oom = ann.get(ANNOTATION_OOM_SCORE_ADJ)
    if oom:
        try:
            values["oom_score_adj"] = int(oom)
        except ValueError:
            problems[ANNOTATION_OOM_SCORE_ADJ] = f"not an integer: {oom!r}"

    values["core_sched_group_id"] = labels.get(LABEL_CORE_SCHED_GROUP_ID, "")
    cs_policy = labels.get(LABEL_CORE_SCHED_POLICY, "")
    if cs_policy in ("", "none", "exclusive"):
        values["core_sched_policy"] = cs_policy
    else:
        problems[LABEL_CORE_SCHED_POLICY] = f"unknown policy {cs_policy!r} (treated as default)"

    for key, msg in problems.items():
        report_problem("pod", pod.uid, pod.key, key, labels.get(key) or ann.get(key) or "", msg)
    return PodExtensions(problems=problems, **values)


def _parse_oom_spec(raw: str) -> dict[str, int]:
    doc = _json(raw)
    if not isinstance(doc, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in doc.values()
    ):
        raise ModelError('expected {"<container>": <int>}')
    return {str(k): int(v) for k, v in doc.items()}


# -- raw pod dict → PodInfo ----------------------------------------------------------------------------------


def compute_kube_qos(containers: Sequence[ContainerInfo]) -> KubeQoS:
    """Kubernetes QoS from cpu/memory requests and limits of every (init) container (k8s `GetPodQOS`)."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers:
        for r in ("cpu", "memory"):
            req = c.requests.get(r, 0)
            if req > 0:
                requests[r] = requests.get(r, 0) + req
            lim = c.limits.get(r, 0)
            if lim > 0:
                limits[r] = limits.get(r, 0) + lim
        if not (c.limits.get("cpu", 0) > 0 and c.limits.get("memory", 0) > 0):
            guaranteed = False
    if not requests and not limits:
        return KubeQoS.BESTEFFORT
    if guaranteed and requests.keys() == limits.keys() and all(requests[r] == limits[r] for r in requests):
        return KubeQoS.GUARANTEED
    return KubeQoS.BURSTABLE


def _container_states(statuses: Any) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    if not isinstance(statuses, list):
        return out
    for st in statuses:
        if not isinstance(st, dict):
            continue
        state = st.get("state") or {}
        kind = next((k for k in ("running", "terminated", "waiting") if k in state), "")
        out[str(st.get("name", ""))] = (str(st.get("containerID") or ""), kind)
    return out


def _containers(
    specs: Any, statuses: Any, init: bool, problems: dict[str, str], where: str
) -> tuple[ContainerInfo, ...]:
    if not isinstance(specs, list):
        return ()
    states = _container_states(statuses)
    out = []
    for spec in specs:
        if not isinstance(spec, dict):
            continue
        name = str(spec.get("name", ""))
        res = spec.get("resources") or {}
        requests, errs = parse_resource_list(res.get("requests") or {})
        limits, lerrs = parse_resource_list(res.get("limits") or {})
        for err in (*errs, *lerrs):
            problems[f"{where}[{name}].resources"] = err
        cid, state = states.get(name, ("", ""))
        out.append(
            ContainerInfo.model_construct(
                name=name,
                container_id=cid,
                requests=requests,
                limits=limits,
                state=state,
                sidecar=init and spec.get("restartPolicy") == "Always",
            )
        )
    return tuple(out)


def parse_pod(raw: Mapping[str, Any], source: str = "api") -> PodInfo:
    """A raw pod dict → PodInfo (no validation pass: the dict is read field by field; malformed parts are
    left out, listed in `problems` and reported once)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    problems: dict[str, str] = {}
    containers = _containers(
        spec.get("containers"), status.get("containerStatuses"), False, problems, "spec.containers"
    )
    init_containers = _containers(
        spec.get("initContainers"), status.get("initContainerStatuses"), True, problems, "spec.initContainers"
    )
    kube_qos = _KUBE_QOS_VALUES.get(status.get("qosClass") or "")
    if kube_qos is None:
        kube_qos = compute_kube_qos((*init_containers, *containers))
    priority = spec.get("priority")
    if not isinstance(priority, int) or isinstance(priority, bool):
        priority = None
    pod = PodInfo.model_construct(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node_name=str(spec.get("nodeName") or ""),
        labels=_str_map(meta.get("labels")),
        annotations=_str_map(meta.get("annotations")),
        phase=str(status.get("phase") or "Pending"),
        kube_qos=kube_qos,
        priority=priority,
        containers=containers,
        init_containers=init_containers,
        resource_version=str(meta.get("resourceVersion", "")),
        deleting=bool(meta.get("deletionTimestamp")),
        source=source,
        creation_timestamp=str(meta.get("creationTimestamp") or ""),
        host_network=spec.get("hostNetwork") is True,
        runtime_class_name=str(spec.get("runtimeClassName") or ""),
        volumes=_volumes(spec.get("volumes")),
        parse_problems=problems,
    )
    for key, msg in problems.items():
        report_problem("pod", pod.uid, pod.key, key, msg, msg)
    _ = pod.ext  # parse labels/annotations now so malformed ones are reported at ingestion
    return pod


def _volumes(value: Any) -> dict[str, str]:
    """spec.volumes → {name: PVC claim name, "" for other kinds} (blkio resolves pod volumes by name)."""
    out: dict[str, str] = {}
    if not isinstance(value, list):
        return out
    for vol in value:
        if not isinstance(vol, Mapping) or not isinstance(vol.get("name"), str):
            continue
        pvc = vol.get("persistentVolumeClaim")
        claim = pvc.get("claimName") if isinstance(pvc, Mapping) else None
        out[vol["name"]] = claim if isinstance(claim, str) else ""
    return out


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}
