"""CPUNormalization: shrink the cfs quota of CPU-share pods on nodes faster than the baseline
(docs/behaviour-runtime-hooks.md, "CPUNormalization")."""

from __future__ import annotations

from collections.abc import Mapping

from koordqos.hooks.batchresource import scale_quota
from koordqos.hooks.context import ContainerContext, PodContext, Stage, qos_from_labels
from koordqos.hooks.cpusetutil import has_pinned_cpuset
from koordqos.hooks.framework import SHARE, HookFn, HookPlugin, HookSpec, Level, Reconciler
from koordqos.hooks.resources import Resources
from koordqos.hooks.rules import NodeRules
from koordqos.model.qos import QoSClass

NAME = "CPUNormalization"
GATE = "CPUNormalization"


def is_pod_cpu_share(labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None) -> bool:
    """LS or no QoS label, and not pinned to a scheduler cpuset."""
    if labels is None:
        return True
    qos = qos_from_labels(labels)
    if qos is QoSClass.NONE and has_pinned_cpuset(annotations):
        return False
    return qos in (QoSClass.LS, QoSClass.NONE)


class CPUNormalization(HookPlugin):
    """The hook plugin; the rule is (enabled, ratio) from the node annotation."""

    name = NAME
    gate = GATE

    def __init__(self) -> None:
        self.enable = False
        self.ratio = -1.0

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {
            Stage.PRE_RUN_POD_SANDBOX: ("adjust pod cfs quota", self.adjust_pod_cfs_quota),
            Stage.PRE_CREATE_CONTAINER: ("adjust container cfs quota", self.adjust_container_cfs_quota),
            Stage.PRE_UPDATE_CONTAINER_RESOURCES: (
                "adjust container cfs quota",
                self.adjust_container_cfs_quota,
            ),
        }

    def reconcilers(self) -> list[Reconciler]:
        """CPU-share pods: pod and container quota."""
        return [
            Reconciler(Level.POD, "cpu.cfs_quota_us", self.adjust_pod_cfs_quota, SHARE),
            Reconciler(Level.CONTAINER, "cpu.cfs_quota_us", self.adjust_container_cfs_quota, SHARE),
        ]

    def update_node(self, node: NodeRules) -> bool:
        """The node's cpu-normalization ratio."""
        return node.ratio is not None and self.update_rule(node.ratio)

    def update_rule(self, ratio: float) -> bool:
        """New ratio (-1 = disabled); True when enable flips or the ratio moves by ≥ 0.01."""
        enable = ratio != -1
        if enable == self.enable and abs(self.ratio - ratio) < 0.01:
            return False
        self.enable, self.ratio = enable, ratio
        return True

    def _adjust(
        self,
        request: Resources | None,
        labels: Mapping[str, str] | None,
        annotations: Mapping[str, str] | None,
        response: Resources,
    ) -> None:
        # the rule first: without a ratio (most nodes) the pod's QoS need not be worked out
        if not self.enable or request is None or not is_pod_cpu_share(labels, annotations):
            return
        orig = request.cfs_quota
        if orig is None or orig <= 0:
            return
        response.cfs_quota = scale_quota(orig, self.ratio)

    def adjust_pod_cfs_quota(self, ctx: PodContext | None) -> None:
        """Pod quota / ratio (only where the request carries resources: reconciler)."""
        if ctx is None:
            raise ValueError("nil pod context")
        r = ctx.request
        self._adjust(r.resources, r.labels, r.annotations, ctx.response.resources)

    def adjust_container_cfs_quota(self, ctx: ContainerContext | None) -> None:
        """Container quota / ratio."""
        if ctx is None:
            raise ValueError("nil container context")
        r = ctx.request
        self._adjust(r.resources, r.pod_labels, r.pod_annotations, ctx.response.resources)


HOOK: HookSpec[CPUNormalization] = HookSpec(NAME, GATE, lambda opts: CPUNormalization())
