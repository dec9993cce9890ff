"""QoS and priority classes and the rules that classify a pod (docs/behaviour-qos-manager.md, "QoS and
priority classes").

Pure functions over label values and container resources; `PodInfo` (`koordqos.model.pod`) exposes them as
properties.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Protocol


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


QOS_VALUES = frozenset(q.value for q in QoSClass) - {""}
PRIORITY_VALUES = frozenset(p.value for p in PriorityClass) - {""}
KUBE_QOS_BY_NAME: Mapping[str, KubeQoS] = {q.value: q for q in KubeQoS}

QOS_BY_KUBE: Mapping[KubeQoS, QoSClass] = {
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


def qos_from_label(value: str | None) -> QoSClass:
    """QoS class from the `koordinator.sh/qosClass` label value only; absent or unknown → NONE."""
    if value is not None and value in QOS_VALUES:
        return QoSClass(value)
    return QoSClass.NONE


def effective_qos(label: str | None, kube_qos: KubeQoS) -> QoSClass:
    """QoS class with the Kubernetes-QoS fallback (Guaranteed→LSR, Burstable→LS, BestEffort→BE)."""
    raw = qos_from_label(label)
    if raw is not QoSClass.NONE:
        return raw
    return QOS_BY_KUBE[kube_qos]


def priority_class_from_label(label: str | None, priority: int | None) -> PriorityClass:
    """Priority class from the `koordinator.sh/priority-class` label, else from spec.priority ranges."""
    if label is not None:
        if label in PRIORITY_VALUES:
            return PriorityClass(label)
        return PriorityClass.NONE
    return priority_class_of(priority)


def effective_priority_class(raw: PriorityClass, qos: QoSClass) -> PriorityClass:
    """Priority class `raw` with the QoS default (SYSTEM/LSE/LSR/LS → prod, BE → batch)."""
    if raw is not PriorityClass.NONE:
        return raw
    if qos is QoSClass.BE:
        return PriorityClass.BATCH
    if qos is QoSClass.NONE:
        return PriorityClass.NONE
    return PriorityClass.PROD


class HasResources(Protocol):
    """What Kubernetes QoS looks at in a container: requests and limits (cpu milli, memory bytes)."""

    @property
    def requests(self) -> Mapping[str, int]: ...

    @property
    def limits(self) -> Mapping[str, int]: ...


def compute_kube_qos(containers: Iterable[HasResources]) -> KubeQoS:
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
