"""GroupIdentity: Anolis `cpu.bvt_warp_ns` per QoS class from NodeSLO (docs/behaviour-runtime-hooks.md,
"GroupIdentity").

Project extension: on kernels without `cpu.bvt_warp_ns` but with `cpu.idle`, the same rule marks
offline groups (bvt -1) `cpu.idle=1` and every other group `cpu.idle=0`, so BE pods still yield to
latency-sensitive ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from koordqos.hooks.context import HostAppContext, KubeQoSContext, PodContext, Stage
from koordqos.hooks.framework import HookFn, HookPlugin, HookSpec, Level, Reconciler
from koordqos.hooks.options import BvtSystem
from koordqos.hooks.resources import Resources
from koordqos.hooks.rules import SLOView
from koordqos.model import jsontext
from koordqos.model.qos import KubeQoS, QoSClass

NAME = "GroupIdentity"
GATE = "GroupIdentity"
ANNOTATION_CPU_QOS = "koordinator.sh/cpuQOS"
POLICY_GROUP_IDENTITY = "groupIdentity"


@dataclass(frozen=True)
class BvtRule:
    """Parsed rule: bvt per koordinator QoS, per kube-QoS dir and per kube-QoS pod (fallback)."""

    enable: bool = False
    pod_qos_params: Mapping[QoSClass, int] = field(default_factory=dict)
    kube_qos_dir_params: Mapping[KubeQoS, int] = field(default_factory=dict)
    kube_qos_pod_params: Mapping[KubeQoS, int] = field(default_factory=dict)

    def pod_value(self, qos: QoSClass, kube_qos: KubeQoS) -> int:
        """Pod bvt: by koordinator QoS, else by kube QoS, else 0."""
        if qos in self.pod_qos_params:
            return self.pod_qos_params[qos]
        return self.kube_qos_pod_params.get(kube_qos, 0)

    def dir_value(self, kube_qos: KubeQoS) -> int:
        """Kube-QoS directory bvt."""
        return self.kube_qos_dir_params.get(kube_qos, 0)


def parse_bvt_rule(view: SLOView) -> BvtRule:
    """Build the rule from merged NodeSLO values (koordlet parseRule)."""
    is_gi = view.cpu_policy is None or view.cpu_policy in ("", POLICY_GROUP_IDENTITY)
    lsr_on = is_gi and view.lsr.enable
    ls_on = is_gi and view.ls.enable
    be_on = is_gi and view.be.enable
    lsr = view.lsr.group_identity if lsr_on else 0
    ls = view.ls.group_identity if ls_on else 0
    be = view.be.group_identity if be_on else 0
    guaranteed_pod = lsr if lsr_on else ls if ls_on else 0
    return BvtRule(
        enable=lsr_on or ls_on or be_on,
        pod_qos_params={QoSClass.LSE: lsr, QoSClass.LSR: lsr, QoSClass.LS: ls, QoSClass.BE: be},
        kube_qos_dir_params={KubeQoS.GUARANTEED: 0, KubeQoS.BURSTABLE: ls, KubeQoS.BESTEFFORT: be},
        kube_qos_pod_params={
            KubeQoS.GUARANTEED: guaranteed_pod,
            KubeQoS.BURSTABLE: ls,
            KubeQoS.BESTEFFORT: be,
        },
    )


class GroupIdentity(HookPlugin):
    """The hook plugin."""

    name = NAME
    gate = GATE

    def __init__(self, system: BvtSystem) -> None:
        self.system = system
        self.rule: BvtRule | None = None

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {Stage.PRE_RUN_POD_SANDBOX: ("set pod bvt value", self.set_pod_bvt_value)}

    def reconcilers(self) -> list[Reconciler]:
        """Pod, kube-QoS dir and host application bvt."""
        return [
            Reconciler(Level.POD, "cpu.bvt_warp_ns", self.set_pod_bvt_value),
            Reconciler(Level.KUBE_QOS, "cpu.bvt_warp_ns", self.set_kube_qos_bvt_value),
            Reconciler(Level.HOST_APP, "cpu.bvt_warp_ns", self.set_host_app_bvt_value),
        ]

    def update_slo(self, view: SLOView) -> bool:
        """The bvt rule from the NodeSLO."""
        return self.update_rule(view)

    def update_rule(self, view: SLOView) -> bool:
        """Parse the rule; True when it differs from the previous one."""
        new = parse_bvt_rule(view)
        if new == self.rule:
            return False
        self.rule = new
        return True

    def prepare(self) -> BvtRule | None:
        """The rule when values should be set now; None means do nothing."""
        if not self.system.supported or self.rule is None:
            return None
        if self.system.sysctl_error:
            return None
        sysctl_on = self.system.sysctl_enabled is None or self.system.sysctl_enabled
        if not self.rule.enable and not sysctl_on:
            return None
        return self.rule

    def _set(self, resources: Resources, bvt: int, qos_dir: bool = False) -> None:
        if self.system.bvt_file or not self.system.idle_file:
            resources.cpu_bvt = bvt
        else:
            # the cpu.idle fallback marks offline pods, never a kube-QoS dir (kubelet writes cpu.shares
            # there, which an idle cgroup refuses)
            resources.cpu_idle = 1 if bvt < 0 and not qos_dir else 0

    def set_pod_bvt_value(self, ctx: PodContext | None) -> None:
        """Pod bvt by QoS; LS pods may override it with the `koordinator.sh/cpuQOS` annotation."""
        if ctx is None:
            raise ValueError("nil pod context")
        rule = self.prepare()
        if rule is None:
            return
        req = ctx.request
        qos = req.qos
        bvt = rule.pod_value(qos, req.kube_qos)
        raw = req.annotations.get(ANNOTATION_CPU_QOS)
        if raw is not None:
            enable, gi = parse_cpu_qos_annotation(raw)
            if qos is QoSClass.LS:
                if gi is not None:
                    bvt = gi
                if not enable:
                    bvt = 0
        self._set(ctx.response.resources, bvt)

    def set_kube_qos_bvt_value(self, ctx: KubeQoSContext) -> None:
        """Kube-QoS directory bvt."""
        rule = self.prepare()
        if rule is not None:
            self._set(ctx.response.resources, rule.dir_value(ctx.kube_qos), qos_dir=True)

    def host_app_bvt(self, qos: QoSClass) -> int | None:
        """Host application bvt by its QoS (0 for unknown); None when nothing should be set."""
        rule = self.prepare()
        if rule is None:
            return None
        return rule.pod_qos_params.get(qos, 0)

    def set_host_app_bvt_value(self, ctx: HostAppContext) -> None:
        """Host application bvt by its QoS (SetHostAppBvtValue)."""
        bvt = self.host_app_bvt(ctx.request.qos)
        if bvt is not None:
            self._set(ctx.response.resources, bvt)


def parse_cpu_qos_annotation(raw: str) -> tuple[bool, int | None]:
    """`{"enable":bool,"groupIdentity":-1..2}` → (enable, groupIdentity); ValueError when malformed."""
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        raise ValueError(f"{ANNOTATION_CPU_QOS}: invalid JSON {raw[:64]!r}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{ANNOTATION_CPU_QOS}: expected an object")
    gi = doc.get("groupIdentity")
    if gi is not None and (not isinstance(gi, int) or isinstance(gi, bool) or not -1 <= gi <= 2):
        raise ValueError(f"{ANNOTATION_CPU_QOS}: groupIdentity must be in [-1, 2], got {gi!r}")
    return bool(doc.get("enable")), gi


HOOK: HookSpec[GroupIdentity] = HookSpec(NAME, GATE, lambda opts: GroupIdentity(opts.bvt))
