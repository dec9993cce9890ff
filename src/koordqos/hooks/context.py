"""Hook stages and the pod / container / kube-QoS / host-app contexts hooks read (request) and fill
(response).

Contexts are independent of how they were built: NRI (`nri/convert.py`), the proxy hook service or the
reconciler all produce the same objects, and hooks never see a protocol message.
`cgroup_parent` is always a directory relative to the cgroup root (v1: below each controller's mount).
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from koordqos.hooks.resources import (
    ExtendedResources,
    ExtendedResourceSpec,
    Resources,
    extended_from_annotation,
    extended_from_pod_spec,
    resources_from_container,
    resources_from_pod,
)
from koordqos.model.keys import ANNOTATION_DOCKER_TYPE, LABEL_QOS
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS, QoSClass

Source = Literal["nri", "proxy", "reconciler"]


class Stage(enum.StrEnum):
    """koordlet's RuntimeHookType values, in their fixed order."""

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_STOP_CONTAINER = "PostStopContainer"
    PRE_REMOVE_RUN_POD_SANDBOX = "PreRemoveRunPodSandbox"


STAGES: tuple[Stage, ...] = tuple(Stage)


_QOS_OF_VALUE: dict[str, QoSClass] = {q.value: q for q in QoSClass}


def qos_from_labels(labels: Mapping[str, str] | None) -> QoSClass:
    """Raw koordinator QoS from the label (annotations are ignored); unknown or missing is NONE."""
    if not labels or LABEL_QOS not in labels:
        return QoSClass.NONE
    # a dict lookup, not QoSClass(value): the enum call costs ≈ 1 µs and several hooks ask per call
    return _QOS_OF_VALUE.get(labels[LABEL_QOS], QoSClass.NONE)


def kube_qos_from_cgroup_parent(cgroup_parent: str) -> KubeQoS:
    """koordlet GetKubeQoSByCgroupParent: besteffort, else burstable, else Guaranteed."""
    if "besteffort" in cgroup_parent:
        return KubeQoS.BESTEFFORT
    if "burstable" in cgroup_parent:
        return KubeQoS.BURSTABLE
    return KubeQoS.GUARANTEED


@dataclass(slots=True)
class PodRequest:
    """What hooks know about a pod sandbox."""

    uid: str
    namespace: str = ""
    name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    resources: Resources | None = None
    extended: ExtendedResourceSpec | None = None
    phase: str = ""

    @property
    def qos(self) -> QoSClass:
        """Raw koordinator QoS class (label only)."""
        return qos_from_labels(self.labels)

    @property
    def kube_qos(self) -> KubeQoS:
        """Kubernetes QoS as the cgroup parent tells it."""
        return kube_qos_from_cgroup_parent(self.cgroup_parent)


@dataclass(slots=True)
class PodResponse:
    """What hooks set for a pod: written to the pod cgroup by the completion step."""

    resources: Resources = field(default_factory=Resources)


@dataclass(slots=True)
class PodContext:
    """A pod-level hook invocation."""

    request: PodRequest
    response: PodResponse = field(default_factory=PodResponse)
    source: Source = "reconciler"


@dataclass(slots=True, init=False)  # `__init__` declared: see `Resources`
class ContainerRequest:
    """What hooks know about a container (or, with `sandbox`, the pod's sandbox container)."""

    pod_uid: str
    container_name: str
    container_id: str  # "<runtime>://<id>"
    sandbox: bool
    pod_namespace: str
    pod_name: str
    pod_labels: Mapping[str, str]
    pod_annotations: Mapping[str, str]
    pod_cgroup_parent: str
    cgroup_parent: str  # the container's own directory; "" when unknown
    envs: Mapping[str, str]
    resources: Resources | None
    extended: ExtendedResources | None

    def __init__(
        self,
        pod_uid: str,
        container_name: str = "",
        container_id: str = "",
        sandbox: bool = False,
        pod_namespace: str = "",
        pod_name: str = "",
        pod_labels: Mapping[str, str] | None = None,
        pod_annotations: Mapping[str, str] | None = None,
        pod_cgroup_parent: str = "",
        cgroup_parent: str = "",
        envs: Mapping[str, str] | None = None,
        resources: Resources | None = None,
        extended: ExtendedResources | None = None,
    ) -> None:
        self.pod_uid = pod_uid
        self.container_name = container_name
        self.container_id = container_id
        self.sandbox = sandbox
        self.pod_namespace = pod_namespace
        self.pod_name = pod_name
        self.pod_labels = {} if pod_labels is None else pod_labels
        self.pod_annotations = {} if pod_annotations is None else pod_annotations
        self.pod_cgroup_parent = pod_cgroup_parent
        self.cgroup_parent = cgroup_parent
        self.envs = {} if envs is None else envs
        self.resources = resources
        self.extended = extended

    @property
    def qos(self) -> QoSClass:
        """Raw koordinator QoS class of the pod (label only)."""
        return qos_from_labels(self.pod_labels)

    @property
    def kube_qos(self) -> KubeQoS:
        """Kubernetes QoS as the cgroup parent tells it."""
        return kube_qos_from_cgroup_parent(self.cgroup_parent or self.pod_cgroup_parent)


@dataclass(frozen=True, slots=True)
class Mount:
    """A mount a hook adds to a container (NRI only: the proxy protocol has no mounts)."""

    destination: str
    source: str
    type: str = "bind"
    options: tuple[str, ...] = ("rbind",)


@dataclass(frozen=True, slots=True)
class LinuxDevice:
    """A device node a hook adds to a container (NRI only), with its numbers and file mode."""

    path: str
    major: int
    minor: int
    type: str = "c"
    file_mode: int = 0o666


@dataclass(slots=True, init=False)  # `__init__` declared: see `Resources`
class ContainerResponse:
    """What hooks set for a container: NRI adjustment/update fields, or container cgroup files."""

    resources: Resources
    add_envs: dict[str, str]
    oom_score_adj: int | None
    rdt_class: str | None  # the resctrl group (closid) the container starts in
    add_mounts: list[Mount]
    add_devices: list[LinuxDevice]

    def __init__(
        self,
        resources: Resources | None = None,
        add_envs: dict[str, str] | None = None,
        oom_score_adj: int | None = None,
        rdt_class: str | None = None,
        add_mounts: list[Mount] | None = None,
        add_devices: list[LinuxDevice] | None = None,
    ) -> None:
        self.resources = Resources() if resources is None else resources
        self.add_envs = {} if add_envs is None else add_envs
        self.oom_score_adj = oom_score_adj
        self.rdt_class = rdt_class
        self.add_mounts = [] if add_mounts is None else add_mounts
        self.add_devices = [] if add_devices is None else add_devices


@dataclass(slots=True, init=False)  # `__init__` declared: see `Resources`
class ContainerContext:
    """A container-level hook invocation."""

    request: ContainerRequest
    response: ContainerResponse
    source: Source

    def __init__(
        self,
        request: ContainerRequest,
        response: ContainerResponse | None = None,
        source: Source = "reconciler",
    ) -> None:
        self.request = request
        self.response = ContainerResponse() if response is None else response
        self.source = source


@dataclass(slots=True)
class KubeQoSContext:
    """A kube-QoS-directory reconcile (Guaranteed / Burstable / BestEffort)."""

    kube_qos: KubeQoS
    cgroup_parent: str
    response: PodResponse = field(default_factory=PodResponse)


def qos_from_name(raw: str) -> QoSClass:
    """A QoS class name as written in a spec (host applications' `qos`); unknown or empty is NONE."""
    try:
        return QoSClass(raw)
    except ValueError:
        return QoSClass.NONE


@dataclass(slots=True)
class HostAppRequest:
    """What hooks know about a NodeSLO host application (docs/behaviour-runtime-hooks.md, "Host
    applications")."""

    name: str
    qos: QoSClass = QoSClass.NONE
    cgroup_parent: str = ""  # checked and confined by whoever built the context


@dataclass(slots=True)
class HostAppContext:
    """A host-application reconcile (reconciler only): cpuset and bvt of the app's cgroup."""

    request: HostAppRequest
    response: PodResponse = field(default_factory=PodResponse)


HookContext = PodContext | ContainerContext


def _pod_gone(uid: str, ref: weakref.ref[PodInfo]) -> None:
    entry = _EXTENDED_OF_POD.get(uid)
    if entry is not None and entry[0] is ref:
        del _EXTENDED_OF_POD[uid]


# pod uid -> (a weak reference to the PodInfo it was computed for, its batch resources): PodInfo is
# immutable, and every container call of a pod asks again (building the spec walks all of the pod's
# containers). Keyed by uid, so one entry per pod (keyed by id(), a fuzz run kept 4,096 stale pods: +15 MiB
# RSS); the PodInfo held weakly, so the entry goes with the pod object (NodeState dropped the pod, or holds
# its next version): a pod that left keeps neither its labels and annotations nor its spec here.
_EXTENDED_OF_POD: dict[str, tuple[weakref.ref[PodInfo], ExtendedResourceSpec | None]] = {}
_EXTENDED_CACHE_SIZE = 1024


def pod_extended(pod: PodInfo) -> ExtendedResourceSpec | None:
    """Batch resources of a pod: the spec first, else the extended-resource-spec annotation.

    Raises ExtendedResourceSpecError when only a malformed annotation is there.
    """
    hit = _EXTENDED_OF_POD.get(pod.uid)
    if hit is not None and hit[0]() is pod:
        return hit[1]
    ext = extended_from_pod_spec(pod) or extended_from_annotation(pod.annotations)
    if hit is None and len(_EXTENDED_OF_POD) >= _EXTENDED_CACHE_SIZE:
        _EXTENDED_OF_POD.clear()  # more pod objects alive than a node has pods: bounded all the same
    # a plain weakref.ref with a closure naming the entry: a compiled build crashed calling a weakref.ref
    # subclass (docs/performance-history.md, "The compiled build")
    uid = pod.uid
    ref = weakref.ref(pod, lambda gone: _pod_gone(uid, gone))
    _EXTENDED_OF_POD[uid] = (ref, ext)
    return ext


def extended_for(
    uid: str, annotations: Mapping[str, str], known: Mapping[str, PodInfo]
) -> ExtendedResourceSpec | None:
    """Batch resources of a pod a runtime call names: from its spec when the API server knows the pod
    (`known`: NodeState's pods), else from its extended-resource-spec annotation, so pods seen only
    through the runtime go through the same hooks. Raises ExtendedResourceSpecError when malformed."""
    pod = known.get(uid)
    if pod is not None:
        return pod_extended(pod)
    return extended_from_annotation(annotations)


def runtime_of(annotations: Mapping[str, str], default_runtime: str) -> str:
    """The runtime prefix of a pod's container ids (docker when the pod says so)."""
    return "docker" if ANNOTATION_DOCKER_TYPE in annotations else default_runtime


def runtime_container_id(annotations: Mapping[str, str], raw_id: str, default_runtime: str) -> str:
    """`<runtime>://<id>` for a container the runtime names by its bare id (docker when the pod says so)."""
    return f"{runtime_of(annotations, default_runtime)}://{raw_id}"


def pod_context_from_pod(pod: PodInfo, cgroup_parent: str) -> PodContext:
    """Reconciler pod context (Resources from the pod's effective requests and limits)."""
    return PodContext(
        PodRequest(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            labels=pod.labels,
            annotations=pod.annotations,
            cgroup_parent=cgroup_parent,
            resources=resources_from_pod(pod),
            extended=pod_extended(pod),
            phase=pod.phase,
        ),
        source="reconciler",
    )


def container_context_from_pod(
    pod: PodInfo,
    container: ContainerInfo,
    pod_cgroup_parent: str,
    cgroup_parent: str,
    extended: ExtendedResourceSpec | None,
) -> ContainerContext:
    """Reconciler container context (Resources from the container's requests and limits)."""
    ext = extended.containers.get(container.name) if extended is not None else None
    return ContainerContext(
        ContainerRequest(
            pod_uid=pod.uid,
            container_name=container.name,
            container_id=container.container_id,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            pod_labels=pod.labels,
            pod_annotations=pod.annotations,
            pod_cgroup_parent=pod_cgroup_parent,
            cgroup_parent=cgroup_parent,
            resources=resources_from_container(container),
            extended=ext,
        ),
        source="reconciler",
    )
