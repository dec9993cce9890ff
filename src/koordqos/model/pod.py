"""Pod and node views: what strategies and hooks read of a pod, parsed once from raw API dicts."""

from __future__ import annotations

import enum
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

LABEL_QOS = "koordinator.sh/qosClass"
LABEL_PRIORITY_CLASS = "koordinator.sh/priority-class"
LABEL_SUB_PRIORITY = "koordinator.sh/priority"
BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"
MID_CPU = "kubernetes.io/mid-cpu"
MID_MEMORY = "kubernetes.io/mid-memory"


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


class ContainerInfo(BaseModel):
    """One container of a pod: its runtime id and resources (cpu in milli, memory in bytes)."""

    model_config = ConfigDict(frozen=True)

    name: str
    container_id: str = ""  # as in status: "<runtime>://<id>", "" when not started yet
    requests: Mapping[str, int] = Field(default_factory=dict)
    limits: Mapping[str, int] = Field(default_factory=dict)


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

    @property
    def key(self) -> str:
        """namespace/name."""
        return f"{self.namespace}/{self.name}"

    @property
    def qos_raw(self) -> QoSClass:
        """QoS class from the label only; anything unknown is NONE."""
        value = self.labels.get(LABEL_QOS, "")
        try:
            return QoSClass(value)
        except ValueError:
            return QoSClass.NONE

    @property
    def qos(self) -> QoSClass:
        """QoS class with the Kubernetes-QoS fallback (Guaranteed→LSR, Burstable→LS, BestEffort→BE)."""
        raw = self.qos_raw
        if raw is not QoSClass.NONE:
            return raw
        return {
            KubeQoS.GUARANTEED: QoSClass.LSR,
            KubeQoS.BURSTABLE: QoSClass.LS,
            KubeQoS.BESTEFFORT: QoSClass.BE,
        }[self.kube_qos]

    @property
    def priority_class_raw(self) -> PriorityClass:
        """Priority class from the label, else from spec.priority ranges."""
        label = self.labels.get(LABEL_PRIORITY_CLASS)
        if label is not None:
            try:
                return PriorityClass(label)
            except ValueError:
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
        try:
            return int(self.labels.get(LABEL_SUB_PRIORITY, "0"))
        except ValueError:
            return 0

    @property
    def terminated(self) -> bool:
        """Phase Succeeded or Failed: cgroups are gone, nothing to do."""
        return self.phase in ("Succeeded", "Failed")

    def request(self, resource: str) -> int:
        """Sum of container requests of `resource` (milli-cpu / bytes)."""
        return sum(c.requests.get(resource, 0) for c in self.containers)

    def limit(self, resource: str) -> int:
        """Sum of container limits of `resource`; 0 if any container has none."""
        total = 0
        for c in self.containers:
            v = c.limits.get(resource, 0)
            if v <= 0:
                return 0
            total += v
        return total


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


class NodeInfo(BaseModel):
    """The Node object's parts the agent reads (cpu in milli, memory in bytes)."""

    model_config = ConfigDict(frozen=True)

    name: str
    labels: Mapping[str, str] = Field(default_factory=dict)
    annotations: Mapping[str, str] = Field(default_factory=dict)
    capacity: Mapping[str, int] = Field(default_factory=dict)
    allocatable: Mapping[str, int] = Field(default_factory=dict)
    resource_version: str = ""
