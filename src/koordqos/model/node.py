"""NodeInfo: the Node object's parts the agent reads, from a raw API dict (or procfs in local mode)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from koordqos.errors import ModelError
from koordqos.model import jsontext
from koordqos.model.cpuset import parse_cpuset
from koordqos.model.problems import report_problem
from koordqos.model.quantity import parse_resource_list

ANNOTATION_CPU_NORMALIZATION_RATIO = "node.koordinator.sh/cpu-normalization-ratio"
ANNOTATION_NODE_RESERVATION = "node.koordinator.sh/reservation"
ANNOTATION_SYSTEM_QOS_RESOURCE = "node.koordinator.sh/system-qos-resource"
ANNOTATION_NETWORK_BANDWIDTH = "node.koordinator.sh/network-bandwidth"
LABEL_CPU_NORMALIZATION_ENABLED = "node.koordinator.sh/cpu-normalization-enabled"
#: koord-manager writes ratios in [1.0, 5.0] (its cpunormalization plugin); koordlet takes any value > 0. A
#: larger one is refused here (issue #39): it would divide BE quotas below what the kernel accepts and
#: multiply standalone batch-cpu past any node (Project decision, docs/reporting.md)
MAX_CPU_NORMALIZATION_RATIO = 5.0


@dataclass(frozen=True, slots=True)
class NodeReservation:
    """Annotation `node.koordinator.sh/reservation`: resources and CPUs kept away from pods."""

    resources: Mapping[str, int] = field(default_factory=dict)
    reserved_cpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SystemQOSResource:
    """Annotation `node.koordinator.sh/system-qos-resource`: CPUs for SYSTEM pods (exclusive by default)."""

    cpuset: tuple[int, ...] = ()
    cpuset_exclusive: bool = True


@dataclass(frozen=True, slots=True)
class NodeExtensions:
    """Typed views of the node annotations the specs use; malformed ones are None and listed in `problems`."""

    cpu_normalization_ratio: float | None = None
    reservation: NodeReservation | None = None
    system_qos_resource: SystemQOSResource | None = None
    problems: Mapping[str, str] = field(default_factory=dict)


class NodeInfo(BaseModel):
    """The Node object's parts the agent reads (cpu in milli, memory in bytes)."""

    model_config = ConfigDict(frozen=True)

    name: str
    labels: Mapping[str, str] = Field(default_factory=dict)
    annotations: Mapping[str, str] = Field(default_factory=dict)
    capacity: Mapping[str, int] = Field(default_factory=dict)
    allocatable: Mapping[str, int] = Field(default_factory=dict)
    resource_version: str = ""
    uid: str = ""
    source: str = "api"  # "api" or "procfs" (local mode)

    @cached_property
    def ext(self) -> NodeExtensions:
        """Parsed annotations (computed once; problems reported once per node and value)."""
        return _parse_extensions(self)

    @property
    def problems(self) -> Mapping[str, str]:
        """Malformed annotations: key → error message."""
        return self.ext.problems

    @property
    def cpu_normalization_ratio(self) -> float | None:
        """`node.koordinator.sh/cpu-normalization-ratio` (> 0); None when absent or malformed."""
        return self.ext.cpu_normalization_ratio

    @property
    def reservation(self) -> NodeReservation | None:
        """`node.koordinator.sh/reservation`; None when absent or malformed."""
        return self.ext.reservation

    @property
    def system_qos_resource(self) -> SystemQOSResource | None:
        """`node.koordinator.sh/system-qos-resource`; None when absent or malformed."""
        return self.ext.system_qos_resource

    def kubelet_reserved(self) -> dict[str, int]:
        """capacity − allocatable for cpu (milli) and memory (bytes), never negative."""
        return {r: max(self.capacity.get(r, 0) - self.allocatable.get(r, 0), 0) for r in ("cpu", "memory")}

    def reserved(self) -> dict[str, int]:
        """koordlet `GetNodeResourceReserved`: element-wise max of kubelet reserved and the reservation
        annotation (reserved CPUs count 1000 milli each)."""
        out = self.kubelet_reserved()
        res = self.reservation
        if res is not None:
            anno = dict(res.resources)
            if res.reserved_cpus:
                anno["cpu"] = len(res.reserved_cpus) * 1000
            for r in ("cpu", "memory"):
                out[r] = max(out[r], anno.get(r, 0))
        return out


def _parse_extensions(node: NodeInfo) -> NodeExtensions:
    problems: dict[str, str] = {}
    ann = node.annotations

    ratio: float | None = None
    raw = ann.get(ANNOTATION_CPU_NORMALIZATION_RATIO)
    if raw is not None:
        try:
            ratio = float(raw)
            if not math.isfinite(ratio):
                raise ValueError(f"not a finite number: {raw[:40]!r}")
            if not 0 < ratio <= MAX_CPU_NORMALIZATION_RATIO:
                raise ValueError(f"must be > 0 and <= {MAX_CPU_NORMALIZATION_RATIO}, got {raw[:40]!r}")
        except ValueError as exc:
            ratio = None
            problems[ANNOTATION_CPU_NORMALIZATION_RATIO] = f"invalid ratio: {exc}"

    reservation: NodeReservation | None = None
    raw = ann.get(ANNOTATION_NODE_RESERVATION)
    if raw is not None:
        try:
            doc = jsontext.loads(raw)
            if not isinstance(doc, dict):
                raise ModelError("expected a JSON object")
            resources, errs = parse_resource_list(doc.get("resources") or {})
            if errs:
                raise ModelError("; ".join(errs))
            cpus = doc.get("reservedCPUs") or ""
            if not isinstance(cpus, str):
                raise ModelError("reservedCPUs must be a string")
            reservation = NodeReservation(resources, parse_cpuset(cpus))
        except (ValueError, ModelError) as exc:
            problems[ANNOTATION_NODE_RESERVATION] = str(exc)

    sysqos: SystemQOSResource | None = None
    raw = ann.get(ANNOTATION_SYSTEM_QOS_RESOURCE)
    if raw is not None:
        try:
            doc = jsontext.loads(raw)
            if not isinstance(doc, dict):
                raise ModelError("expected a JSON object")
            excl = doc.get("cpusetExclusive", True)
            if not isinstance(excl, bool):
                raise ModelError("cpusetExclusive must be a boolean")
            cpus = doc.get("cpuset") or ""
            if not isinstance(cpus, str):
                raise ModelError("cpuset must be a string")
            sysqos = SystemQOSResource(parse_cpuset(cpus), excl)
        except (ValueError, ModelError) as exc:
            problems[ANNOTATION_SYSTEM_QOS_RESOURCE] = str(exc)

    for key, msg in problems.items():
        report_problem("node", node.uid or node.name, node.name, key, ann.get(key, ""), msg)
    return NodeExtensions(ratio, reservation, sysqos, problems)


def parse_node(raw: Mapping[str, Any]) -> NodeInfo:
    """A raw Node dict → NodeInfo (malformed quantities are left out and reported)."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    name = str(meta.get("name", ""))
    uid = str(meta.get("uid", ""))
    capacity, cap_errs = parse_resource_list(status.get("capacity") or {})
    allocatable, alloc_errs = parse_resource_list(status.get("allocatable") or {})
    for err in cap_errs:
        report_problem("node", uid or name, name, "status.capacity", err, err)
    for err in alloc_errs:
        report_problem("node", uid or name, name, "status.allocatable", err, err)
    node = NodeInfo.model_construct(
        name=name,
        labels=_str_map(meta.get("labels")),
        annotations=_str_map(meta.get("annotations")),
        capacity=capacity,
        allocatable=allocatable,
        resource_version=str(meta.get("resourceVersion", "")),
        uid=uid,
        source="api",
    )
    _ = node.ext  # report malformed annotations at ingestion, once
    return node


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}
