"""Typed views of a pod's Koordinator labels and annotations, and their parsers.

`parse_extensions(labels, annotations, …)` reads every label/annotation the agent understands into a
`PodExtensions` (formats: docs/behaviour-runtime-hooks.md, "Keys the agent reads"; keys in
`koordqos.model.keys`). A malformed value falls back as its rule says (usually "absent") and is listed in
`problems` (key → message), which is reported once per pod and value (`koordqos_model_errors_total`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from koordqos.errors import ModelError
from koordqos.model import jsontext
from koordqos.model.cpuset import parse_cpuset
from koordqos.model.keys import (
    ANNOTATION_CPU_BURST,
    ANNOTATION_CPU_QOS,
    ANNOTATION_EVICTION_POLICY,
    ANNOTATION_EVICTION_PRIORITY,
    ANNOTATION_EXTENDED_RESOURCE_SPEC,
    ANNOTATION_MEMORY_QOS,
    ANNOTATION_OOM_SCORE_ADJ,
    ANNOTATION_OOM_SCORE_ADJ_SPEC,
    ANNOTATION_RESOURCE_STATUS,
    BATCH_CPU,
    LABEL_CORE_SCHED_GROUP_ID,
    LABEL_CORE_SCHED_POLICY,
    LABEL_EVICTION_ENABLED,
    LABEL_PRIORITY_CLASS,
    LABEL_QOS,
    LABEL_SUB_PRIORITY,
)
from koordqos.model.nodeslo import CPUBurstConfig, PodCPUQOSConfig, PodMemoryQOSConfig, format_model_error
from koordqos.model.problems import report_problem
from koordqos.model.qos import PRIORITY_VALUES, QOS_VALUES
from koordqos.model.quantity import parse_resource_list


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
        """Some NUMA node carries a non-zero `cpu` or a positive batch-cpu (docs/behaviour-runtime-hooks.md,
        "CPUSetAllocator")."""
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


def _json(raw: str) -> Any:
    try:
        return jsontext.loads(raw)
    except jsontext.JSONTextError as exc:
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
        doc = jsontext.loads(raw)
    except jsontext.JSONTextError:
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


def _parse_oom_spec_text(raw: str) -> dict[str, int]:
    doc = _json(raw)
    if not isinstance(doc, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in doc.values()
    ):
        raise ModelError('expected {"<container>": <int>}')
    return {str(k): int(v) for k, v in doc.items()}


def _eviction_priority(raw: str) -> int:
    try:
        prio = int(raw)
    except ValueError as exc:
        raise ModelError(f"invalid int32 ({exc}); using 0") from None
    if not -(2**31) <= prio < 2**31:
        raise ModelError("invalid int32 (out of int32 range); using 0")
    return prio


def _integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ModelError(f"not an integer: {raw[:64]!r}") from None


def _eviction_policy(raw: str) -> frozenset[str]:
    allowed = parse_eviction_policy(raw)
    if not allowed:
        # the pod keeps the (empty) policy: no eviction allowed, and the problem is reported
        raise _Fallback(allowed, "not a non-empty JSON array of names: no eviction allowed")
    return allowed


def _core_sched_policy(raw: str) -> str:
    if raw in ("", "none", "exclusive"):
        return raw
    raise ModelError(f"unknown policy {raw[:64]!r} (treated as default)")


class _Fallback(ModelError):
    """A malformed value that still has a value to use (besides the problem to report)."""

    def __init__(self, value: Any, message: str) -> None:
        super().__init__(message)
        self.value = value


# (where, key, PodExtensions attribute, parser); each parser gets the raw text and returns the typed value
# or raises (ModelError for the malformed values it knows; anything else is caught the same way).
_PARSERS: tuple[tuple[str, str, str, Callable[[str], Any]], ...] = (
    ("label", LABEL_SUB_PRIORITY, "priority_label", _integer),
    ("annotation", ANNOTATION_EVICTION_PRIORITY, "eviction_priority", _eviction_priority),
    ("annotation", ANNOTATION_EVICTION_POLICY, "eviction_policy", _eviction_policy),
    ("annotation", ANNOTATION_RESOURCE_STATUS, "resource_status", parse_resource_status),
    ("annotation", ANNOTATION_EXTENDED_RESOURCE_SPEC, "extended_resource_spec", parse_extended_resource_spec),
    ("annotation", ANNOTATION_CPU_QOS, "cpu_qos", lambda r: _model_annotation(PodCPUQOSConfig, r)),
    ("annotation", ANNOTATION_MEMORY_QOS, "memory_qos", lambda r: _model_annotation(PodMemoryQOSConfig, r)),
    ("annotation", ANNOTATION_CPU_BURST, "cpu_burst", lambda r: _model_annotation(CPUBurstConfig, r)),
    ("annotation", ANNOTATION_OOM_SCORE_ADJ_SPEC, "oom_score_adj_spec", _parse_oom_spec_text),
    ("annotation", ANNOTATION_OOM_SCORE_ADJ, "oom_score_adj", _integer),
    ("label", LABEL_CORE_SCHED_POLICY, "core_sched_policy", _core_sched_policy),
)
# empty text means "absent" for these (resource-status "" is an error: no JSON object)
_EMPTY_IS_ABSENT = frozenset(
    {
        ANNOTATION_EXTENDED_RESOURCE_SPEC,
        ANNOTATION_CPU_QOS,
        ANNOTATION_MEMORY_QOS,
        ANNOTATION_CPU_BURST,
        ANNOTATION_OOM_SCORE_ADJ_SPEC,
        ANNOTATION_OOM_SCORE_ADJ,
    }
)


def parse_extensions(
    labels: Mapping[str, str], ann: Mapping[str, str], uid: str, pod_key: str
) -> PodExtensions:
    """Labels/annotations → PodExtensions; each problem is reported once for pod `uid` (`pod_key`).

    Total: any exception while parsing one label or annotation (bad JSON, nesting deep enough for a
    RecursionError, a huge number, a wrong type) leaves that one at its fallback and lists it in `problems`;
    the others are parsed as usual.
    """
    problems: dict[str, str] = {}
    values: dict[str, Any] = {}

    qos = labels.get(LABEL_QOS)
    if qos and qos not in QOS_VALUES:
        problems[LABEL_QOS] = f"unknown QoS class {qos[:64]!r} (treated as none)"
    pc = labels.get(LABEL_PRIORITY_CLASS)
    if pc is not None and pc not in PRIORITY_VALUES:
        problems[LABEL_PRIORITY_CLASS] = f"unknown priority class {pc[:64]!r} (treated as none)"
    values["eviction_enabled"] = labels.get(LABEL_EVICTION_ENABLED) == "true"
    values["core_sched_group_id"] = labels.get(LABEL_CORE_SCHED_GROUP_ID, "")

    for where, key, attr, parser in _PARSERS:
        raw = (labels if where == "label" else ann).get(key)
        if raw is None or (raw == "" and key in _EMPTY_IS_ABSENT):
            continue
        try:
            values[attr] = parser(raw)
        except _Fallback as exc:
            values[attr] = exc.value
            problems[key] = str(exc)
        except ModelError as exc:
            problems[key] = str(exc)
        except Exception as exc:  # the parser did not foresee this input: the annotation is ignored
            problems[key] = f"unreadable ({type(exc).__name__}: {str(exc)[:200]})"

    for key, msg in problems.items():
        report_problem("pod", uid, pod_key, key, labels.get(key) or ann.get(key) or "", msg)
    return PodExtensions(problems=problems, **values)
