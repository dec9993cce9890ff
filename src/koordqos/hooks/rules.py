"""Rule inputs: the few NodeSLO and Node values the hooks' rules are parsed from.

`SLOView` is read from the shared (already defaults-merged) NodeSLO model by `slo_view`; hooks never
see the model itself, so their rule parsing is testable with plain values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from koordqos.model import jsontext
from koordqos.model.node import MAX_CPU_NORMALIZATION_RATIO, NodeInfo
from koordqos.model.nodeslo import NodeSLO, ResourceQOS

ANNOTATION_CPU_NORMALIZATION_RATIO = "node.koordinator.sh/cpu-normalization-ratio"
ANNOTATION_CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
ANNOTATION_BE_CPU_SHARED_POOLS = "node.koordinator.sh/be-cpu-shared-pools"
ANNOTATION_KUBELET_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
ANNOTATION_SYSTEM_QOS_RESOURCE = "node.koordinator.sh/system-qos-resource"


class RuleError(ValueError):
    """A rule input that cannot be parsed; the rule keeps its previous value."""


class RatioIgnored(RuleError):
    """A cpu-normalization ratio that parses but is not finite ("inf", "nan"): treated as absent."""


@dataclass(frozen=True, slots=True)
class ClassCPUQOS:
    """One QoS class's `cpuQOS` after the defaults merge (a disabled class carries NoneCPUQOS)."""

    enable: bool = False
    group_identity: int = 0
    sched_idle: int = 0
    core_expeller: bool = False


NONE_CPU_QOS = ClassCPUQOS()


@dataclass(frozen=True, slots=True)
class SLOView:
    """NodeSLO values the hooks use (defaults: koordlet's merged DefaultNodeSLOSpecConfig)."""

    be_threshold_enable: bool = False
    cpu_suppress_policy: str = "cpuset"
    cpu_policy: str | None = "groupIdentity"  # resourceQOSStrategy.policies.cpuPolicy; None when unset
    lsr: ClassCPUQOS = NONE_CPU_QOS
    ls: ClassCPUQOS = NONE_CPU_QOS
    be: ClassCPUQOS = NONE_CPU_QOS


def _class_cpu_qos(cls: ResourceQOS | None) -> ClassCPUQOS:
    q = None if cls is None else cls.cpu_qos
    if q is None or not q.enable:
        return NONE_CPU_QOS
    return ClassCPUQOS(True, q.group_identity or 0, q.sched_idle or 0, bool(q.core_expeller))


def slo_view(slo: NodeSLO | None) -> SLOView:
    """Extract the hooks' values from the shared, defaults-merged NodeSLO model (None → defaults)."""
    if slo is None:
        return SLOView()
    thr = slo.resource_used_threshold_with_be
    strategy = slo.resource_qos_strategy
    policies = None if strategy is None else strategy.policies
    return SLOView(
        be_threshold_enable=bool(thr is not None and thr.enable),
        cpu_suppress_policy=(thr.cpu_suppress_policy if thr is not None else None) or "cpuset",
        cpu_policy=None if policies is None else policies.cpu_policy,
        lsr=_class_cpu_qos(None if strategy is None else strategy.lsr_class),
        ls=_class_cpu_qos(None if strategy is None else strategy.ls_class),
        be=_class_cpu_qos(None if strategy is None else strategy.be_class),
    )


def cpu_normalization_ratio(node: NodeInfo | None) -> float:
    """Node annotation ratio: -1 if absent; RatioIgnored if not finite; RuleError if unparsable or <= 0."""
    if node is None:
        raise RuleError("no node")
    raw = node.annotations.get(ANNOTATION_CPU_NORMALIZATION_RATIO)
    if raw is None:
        return -1.0
    try:
        ratio = float(raw)
    except ValueError:
        raise RuleError(f"{ANNOTATION_CPU_NORMALIZATION_RATIO}: not a number: {raw!r}") from None
    if not math.isfinite(ratio):
        # float() accepts "inf"/"nan"; quota/inf is 0, which no cgroup accepts
        raise RatioIgnored(f"{ANNOTATION_CPU_NORMALIZATION_RATIO}: not finite: {raw!r}; treated as absent")
    if not ratio > 0:
        raise RuleError(f"{ANNOTATION_CPU_NORMALIZATION_RATIO}: must be > 0, got {raw!r}")
    if ratio > MAX_CPU_NORMALIZATION_RATIO:
        # koord-manager never writes more; quota / ratio would fall below what the kernel accepts
        limit = MAX_CPU_NORMALIZATION_RATIO
        raise RuleError(f"{ANNOTATION_CPU_NORMALIZATION_RATIO}: must be <= {limit}, got {raw[:40]!r}")
    return ratio


@dataclass(frozen=True, slots=True)
class CPUSharePool:
    """One LS/BE share pool: the CPUs of a NUMA node not pinned to pods."""

    socket: int
    node: int
    cpuset: str


@dataclass(frozen=True, slots=True)
class TopologyView:
    """CPUSetAllocator inputs (koordlet reads them from NodeResourceTopology annotations)."""

    share_pools: tuple[CPUSharePool, ...] = ()
    be_share_pools: tuple[CPUSharePool, ...] = ()
    kubelet_policy: str = ""
    system_qos_cpuset: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)


def _pools(raw: str | None, key: str) -> tuple[CPUSharePool, ...]:
    if not raw:
        return ()
    try:
        doc = jsontext.loads(raw)
        return tuple(
            CPUSharePool(_pool_id(p.get("socket", 0)), _pool_id(p.get("node", 0)), str(p.get("cpuset", "")))
            for p in doc
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise RuleError(f"{key}: invalid share pools: {exc}") from None


def _pool_id(value: object) -> int:
    """A socket or NUMA node id of a share pool: a JSON integer (Go's int32), ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise ValueError(f"expected an id from 0 to 2147483647, got {str(value)[:40]}")
    return value


def topology_view(annotations: Mapping[str, str]) -> TopologyView:
    """Parse the share pools, kubelet policy and SYSTEM cpuset annotations; RuleError on bad JSON."""
    from koordqos.hooks.cpusetutil import parse_cpuset

    shared = _pools(annotations.get(ANNOTATION_CPU_SHARED_POOLS), ANNOTATION_CPU_SHARED_POOLS)
    be_shared = _pools(annotations.get(ANNOTATION_BE_CPU_SHARED_POOLS), ANNOTATION_BE_CPU_SHARED_POOLS)
    policy = ""
    raw_policy = annotations.get(ANNOTATION_KUBELET_CPU_MANAGER_POLICY)
    if raw_policy:
        try:
            doc = jsontext.loads(raw_policy)
            policy = str(doc.get("policy", "")) if isinstance(doc, dict) else ""
        except ValueError as exc:
            raise RuleError(f"{ANNOTATION_KUBELET_CPU_MANAGER_POLICY}: {exc}") from None
    system = ""
    raw_system = annotations.get(ANNOTATION_SYSTEM_QOS_RESOURCE)
    if raw_system:
        try:
            doc = jsontext.loads(raw_system)
        except ValueError as exc:
            raise RuleError(f"{ANNOTATION_SYSTEM_QOS_RESOURCE}: {exc}") from None
        system = str(doc.get("cpuset", "")) if isinstance(doc, dict) else ""
        if system:
            try:
                parse_cpuset(system)
            except ValueError as exc:
                raise RuleError(f"{ANNOTATION_SYSTEM_QOS_RESOURCE}: {exc}") from None
    return TopologyView(shared, be_shared, policy, system, dict(annotations))


@dataclass(frozen=True, slots=True)
class NodeRules:
    """What a Node change offers the hooks' rules: the cpu-normalization ratio (None when its annotation
    is invalid: those rules keep their value) and the annotations the topology view is parsed from."""

    ratio: float | None
    annotations: Mapping[str, str] = field(default_factory=dict)

    def topology(self) -> TopologyView:
        """The CPUSetAllocator inputs (RuleError on bad JSON)."""
        return topology_view(self.annotations)
