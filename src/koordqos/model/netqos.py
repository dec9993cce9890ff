"""Network QoS inputs (docs/network-qos.md): the NodeSLO's bandwidths, a pod's own limits, its class.

Pure. Every bandwidth here is in **bits per second**, as the NodeSLO and the pod annotation give it:
`systemStrategy.totalNetworkBandwidth` is a quantity ("1000M" = 10⁹ bit/s), and each class's `networkQOS`
value is either an int percent of that total (0–100; anything else counts 0) or a quantity of its own. The
two consumers convert at their edge: tc takes `rate <n>bit`, terway reads bytes per second.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from koordqos.errors import ModelError
from koordqos.model import jsontext
from koordqos.model.keys import ANNOTATION_NETWORK_QOS
from koordqos.model.nodeslo import NetworkQOS, NodeSLO
from koordqos.model.qos import KubeQoS, QoSClass

POLICY_TC = "tc"
POLICY_TERWAY = "terway-qos"


class NetClass(enum.StrEnum):
    """koordlet's NetQoSClass: the class (and ipset name) a pod's traffic belongs to."""

    SYSTEM = "system_class"
    LS = "ls_class"
    BE = "be_class"
    NONE = ""


def net_class(qos: QoSClass) -> NetClass:
    """From the raw QoS label: SYSTEM → system, LSE/LSR/LS → LS, BE → BE, none or unknown → none."""
    if qos is QoSClass.SYSTEM:
        return NetClass.SYSTEM
    if qos in (QoSClass.LSE, QoSClass.LSR, QoSClass.LS):
        return NetClass.LS
    if qos is QoSClass.BE:
        return NetClass.BE
    return NetClass.NONE


def terway_prio(qos: QoSClass, kube_qos: KubeQoS | None) -> int:
    """terway's `prio`: SYSTEM 0, LSE/LSR/LS 1, BE 2; no label: Guaranteed/Burstable 1, BestEffort 2, or 0."""
    if qos is QoSClass.SYSTEM:
        return 0
    if qos in (QoSClass.LSE, QoSClass.LSR, QoSClass.LS):
        return 1
    if qos is QoSClass.BE:
        return 2
    if kube_qos in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE):
        return 1
    if kube_qos is KubeQoS.BESTEFFORT:
        return 2
    return 0


def quantity_bits(text: str) -> int:
    """A bandwidth quantity ("10M", "1G", "500k") in whole bits per second; ModelError if malformed or < 0."""
    from koordqos.model.quantity import to_int

    value = to_int(text)  # ModelError on bad text
    if value < 0:
        raise ModelError(f"negative bandwidth {text!r}")
    return value


def class_value(value: int | str | None, total: int) -> int:
    """One `networkQOS` field in bit/s: an int is a percent of `total` (outside 0–100 it counts 0, as
    koordlet), a string a quantity (ModelError if malformed)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return total * value // 100 if 0 <= value <= 100 else 0
    return quantity_bits(value)


@dataclass(frozen=True, slots=True)
class ClassBandwidth:
    """A class's (L1 = LS, L2 = BE) guaranteed (`*_min`) and maximal (`*_max`) bandwidth, bit/s; all zero
    when the class's networkQOS is not enabled."""

    enabled: bool = False
    ingress_min: int = 0
    ingress_max: int = 0
    egress_min: int = 0
    egress_max: int = 0


@dataclass(frozen=True, slots=True)
class NetQoSConfig:
    """The node's network QoS as the NodeSLO says: policy, total bandwidth, the LS (L1) and BE (L2) classes.
    `problems` lists the fields that could not be read (they count as not set)."""

    policy: str  # "tc" (also when unset) or "terway-qos"
    total: int  # bit/s; 0 = unknown
    has_system_strategy: bool
    ls: ClassBandwidth = ClassBandwidth()
    be: ClassBandwidth = ClassBandwidth()
    problems: tuple[str, ...] = ()


def _class(cfg: NetworkQOS | None, total: int, name: str, problems: list[str]) -> ClassBandwidth:
    if cfg is None or not cfg.enable:
        return ClassBandwidth()
    values: list[int] = []
    for field in ("ingress_request", "ingress_limit", "egress_request", "egress_limit"):
        try:
            values.append(class_value(getattr(cfg, field), total))
        except ModelError as exc:
            problems.append(f"{name}.networkQOS.{field}: {exc}")
            values.append(0)
    return ClassBandwidth(True, values[0], values[1], values[2], values[3])


def netqos_config(slo: NodeSLO | None) -> NetQoSConfig | None:
    """The network QoS of a (defaults-merged) NodeSLO; None without a NodeSLO."""
    if slo is None:
        return None
    problems: list[str] = []
    system = slo.system_strategy
    total = 0
    if system is not None and system.total_network_bandwidth is not None:
        raw = system.total_network_bandwidth
        try:
            total = quantity_bits(str(raw)) if not isinstance(raw, int) else max(raw, 0)
        except ModelError as exc:
            problems.append(f"systemStrategy.totalNetworkBandwidth: {exc}")
    strategy = slo.resource_qos_strategy
    policies = None if strategy is None else strategy.policies
    policy = (None if policies is None else policies.net_qos_policy) or POLICY_TC
    ls_cfg = None if strategy is None or strategy.ls_class is None else strategy.ls_class.network_qos
    be_cfg = None if strategy is None or strategy.be_class is None else strategy.be_class.network_qos
    return NetQoSConfig(
        policy=policy,
        total=total,
        has_system_strategy=system is not None,
        ls=_class(ls_cfg, total, "lsClass", problems),
        be=_class(be_cfg, total, "beClass", problems),
        problems=tuple(problems),
    )


@dataclass(frozen=True, slots=True)
class PodBandwidth:
    """A pod's own limits from `koordinator.sh/networkQOS`, bit/s (0: no limit)."""

    ingress: int = 0
    egress: int = 0

    @property
    def limited(self) -> bool:
        """Whether the pod has a limit of its own (it then gets its own tc class)."""
        return self.ingress > 0 or self.egress > 0


NO_LIMIT = PodBandwidth()


def pod_bandwidth(annotations: Mapping[str, str]) -> PodBandwidth:
    """`{"ingressLimit":"10M","egressLimit":"10M"}` (bit/s; a missing key is no limit); ModelError when the
    annotation is malformed."""
    raw = annotations.get(ANNOTATION_NETWORK_QOS, "")
    if not raw:
        return NO_LIMIT
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        raise ModelError(f"{ANNOTATION_NETWORK_QOS}: invalid JSON {raw[:64]!r}") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{ANNOTATION_NETWORK_QOS}: expected an object")
    out = []
    for key in ("ingressLimit", "egressLimit"):
        value = doc.get(key, "0")
        if not isinstance(value, str):
            raise ModelError(f"{ANNOTATION_NETWORK_QOS}: {key} must be a quantity string")
        try:
            out.append(quantity_bits(value))
        except ModelError as exc:
            raise ModelError(f"{ANNOTATION_NETWORK_QOS}: {key}: {exc}") from None
    return PodBandwidth(out[0], out[1])
