"""The pod as strategies and hooks read it (`PodInfo`), parsed once from a raw API dict.

`parse_pod(raw)` turns a pod JSON dict (as the API server or kubelet sends it) into a `PodInfo` without the
Kubernetes client's typed models. Quantities are integers: `cpu` in milli-cores, memory in bytes, batch/mid
CPU as the integer milli-cores they are on the wire. Classification (QoS, priority) is `koordqos.model.qos`;
label/annotation keys are `koordqos.model.keys` and their parsers `koordqos.model.pod_annotations`.

Typed accessors (`pod.resource_status`, `pod.cpu_qos`, `pod.eviction_priority`, …) parse lazily, once per
PodInfo. A malformed value falls back as its rule says (usually "absent") and is listed in `pod.problems`
(key → message), which is logged and counted once per pod and value (`koordqos_model_errors_total`).
Hooks whose rule says "bad JSON → error" check `pod.problems` for their key.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from koordqos.model.keys import ANNOTATION_DOCKER_TYPE, LABEL_PRIORITY_CLASS, LABEL_QOS
from koordqos.model.nodeslo import CPUBurstConfig, PodCPUQOSConfig, PodMemoryQOSConfig
from koordqos.model.pod_annotations import ContainerResources, PodExtensions, ResourceStatus, parse_extensions
from koordqos.model.problems import report_problem
from koordqos.model.qos import (
    KUBE_QOS_BY_NAME,
    PRIORITY_DEFAULT,
    KubeQoS,
    PriorityClass,
    QoSClass,
    compute_kube_qos,
    effective_priority_class,
    effective_qos,
    priority_class_from_label,
    qos_from_label,
)
from koordqos.model.quantity import parse_resource_list

__all__ = ["ContainerInfo", "PodInfo", "parse_pod"]


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
    pod_ip: str = ""  # status.podIP (network QoS classifies a pod's traffic by it)
    runtime_class_name: str = ""
    volumes: Mapping[str, str] = Field(default_factory=dict)  # volume name → PVC claim name ("" if not a PVC)
    parse_problems: Mapping[str, str] = Field(default_factory=dict)  # malformed quantities seen by parse_pod

    @property
    def key(self) -> str:
        """namespace/name."""
        return f"{self.namespace}/{self.name}"

    # -- QoS and priority (docs/behaviour-qos-manager.md, "QoS and priority classes") ----------------------

    @property
    def qos_raw(self) -> QoSClass:
        """QoS class from the label only; anything unknown is NONE."""
        return qos_from_label(self.labels.get(LABEL_QOS))

    @property
    def qos(self) -> QoSClass:
        """QoS class with the Kubernetes-QoS fallback (Guaranteed→LSR, Burstable→LS, BestEffort→BE)."""
        return effective_qos(self.labels.get(LABEL_QOS), self.kube_qos)

    @property
    def priority_class_raw(self) -> PriorityClass:
        """Priority class from the label, else from spec.priority ranges."""
        return priority_class_from_label(self.labels.get(LABEL_PRIORITY_CLASS), self.priority)

    @property
    def priority_class(self) -> PriorityClass:
        """Priority class with the QoS default (SYSTEM/LSE/LSR/LS → prod, BE → batch)."""
        return effective_priority_class(self.priority_class_raw, self.qos)

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

    # -- typed annotations and labels (docs/behaviour-runtime-hooks.md, "Keys the agent reads") --------------

    @cached_property
    def ext(self) -> PodExtensions:
        """Parsed Koordinator labels/annotations (computed once; problems reported once per pod and value)."""
        return parse_extensions(self.labels, self.annotations, self.uid, self.key)

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


# -- raw pod dict → PodInfo ----------------------------------------------------------------------------------


def _container_states(statuses: Any) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    if not isinstance(statuses, list):
        return out
    for st in statuses:
        if not isinstance(st, dict):
            continue
        state = _mapping(st.get("state"))
        kind = next((k for k in ("running", "terminated", "waiting") if k in state), "")
        out[_text(st.get("name"))] = (_text(st.get("containerID")), kind)
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
        name = _text(spec.get("name"))
        res = _mapping(spec.get("resources"))
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
    left out, listed in `problems` and reported once). Total for any JSON-shaped input: a part of the wrong
    type is treated as absent, and no label or annotation value makes it raise."""
    meta = _mapping(raw.get("metadata"))
    spec = _mapping(raw.get("spec"))
    status = _mapping(raw.get("status"))
    problems: dict[str, str] = {}
    containers = _containers(
        spec.get("containers"), status.get("containerStatuses"), False, problems, "spec.containers"
    )
    init_containers = _containers(
        spec.get("initContainers"), status.get("initContainerStatuses"), True, problems, "spec.initContainers"
    )
    kube_qos = KUBE_QOS_BY_NAME.get(_text(status.get("qosClass")))
    if kube_qos is None:
        kube_qos = compute_kube_qos((*init_containers, *containers))
    priority = spec.get("priority")
    if not isinstance(priority, int) or isinstance(priority, bool):
        priority = None
    pod = PodInfo.model_construct(
        uid=_text(meta.get("uid")),
        namespace=_text(meta.get("namespace")),
        name=_text(meta.get("name")),
        node_name=_text(spec.get("nodeName")),
        labels=_str_map(meta.get("labels")),
        annotations=_str_map(meta.get("annotations")),
        phase=_text(status.get("phase")) or "Pending",
        kube_qos=kube_qos,
        priority=priority,
        containers=containers,
        init_containers=init_containers,
        resource_version=_text(meta.get("resourceVersion")),
        deleting=bool(meta.get("deletionTimestamp")),
        source=source,
        creation_timestamp=_text(meta.get("creationTimestamp")),
        host_network=spec.get("hostNetwork") is True,
        pod_ip=_text(status.get("podIP")),
        runtime_class_name=_text(spec.get("runtimeClassName")),
        volumes=_volumes(spec.get("volumes")),
        parse_problems=problems,
    )
    for key, msg in problems.items():
        report_problem("pod", pod.uid, pod.key, key, msg, msg)
    _ = pod.ext  # parse labels/annotations now so malformed ones are reported at ingestion
    return pod


def _mapping(value: Any) -> Mapping[str, Any]:
    """`value` when it is a mapping, else {} (a part of the wrong type counts as absent)."""
    return value if isinstance(value, Mapping) else {}


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
    return {str(k): _text(v) for k, v in value.items()}


def _text(value: Any) -> str:
    """A scalar as text; None and containers (lists, objects: never valid here) as "" (their repr could
    even recurse too deeply)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        try:
            return str(value)
        except ValueError:  # an int past the interpreter's digit limit
            return ""
    return ""
