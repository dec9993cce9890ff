"""Hook registration: a hook is one module (plugin class + HookSpec) and one registry line."""

from __future__ import annotations

from koordqos.hooks.context import (
    ContainerContext,
    ContainerRequest,
    KubeQoSContext,
    PodContext,
    PodRequest,
    Stage,
)
from koordqos.hooks.framework import BE, HookFn, HookPlugin, HookSpec, Level, Reconciler
from koordqos.hooks.options import HookOptions
from koordqos.hooks.registry import HOOKS
from koordqos.hooks.rules import NodeRules, SLOView
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.qos import KubeQoS

BE_LABELS = {"koordinator.sh/qosClass": "BE"}


class Marker(HookPlugin):
    """A hook as a new module would write it: stages, reconcilers and rules in one class."""

    name = "Marker"

    def __init__(self) -> None:
        self.slo_updates = 0
        self.node_ratios: list[float | None] = []

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        return {Stage.PRE_CREATE_CONTAINER: ("mark container", self.mark_container)}

    def reconcilers(self) -> list[Reconciler]:
        return [
            Reconciler(Level.CONTAINER, "cpu.shares", self.mark_container, BE),
            Reconciler(Level.KUBE_QOS, "cpu.idle", self.mark_kube_qos),
        ]

    def update_slo(self, view: SLOView) -> bool:
        self.slo_updates += 1
        return True

    def update_node(self, node: NodeRules) -> bool:
        self.node_ratios.append(node.ratio)
        return False

    def mark_container(self, ctx: ContainerContext) -> None:
        ctx.response.resources.cpu_shares = 7

    def mark_kube_qos(self, ctx: KubeQoSContext) -> None:
        ctx.response.resources.cpu_idle = 1


MARKER = HookSpec("Marker", "MarkerGate", lambda opts: Marker())


def test_the_builtin_registry_lists_every_hook_module_once() -> None:
    names = [spec.name for spec in HOOKS]
    assert names == [
        "BatchResource",
        "CPUSetAllocator",
        "CPUNormalization",
        "GroupIdentity",
        "CoreSched",
        "OOMScoreAdj",
        "Resctrl",
        "gpu env inject",
        "rdma device inject",
    ]
    assert len({spec.gate for spec in HOOKS}) == len(HOOKS)


def test_a_registered_hook_gets_its_stage_reconcilers_and_rules() -> None:
    hooks = RuntimeHooks(HookOptions(gates={"MarkerGate": True}), specs=(MARKER,))
    marker = hooks.get(Marker)
    assert marker is not None
    assert hooks.names == ["Marker"]
    assert [h.name for h in hooks.registry.hooks(Stage.PRE_CREATE_CONTAINER)] == ["Marker"]
    assert hooks.registry.stages() == [Stage.PRE_CREATE_CONTAINER]
    # reconcilers at their level, under their QoS conditions
    be = ContainerContext(ContainerRequest(pod_uid="u", pod_labels=BE_LABELS))
    ls = ContainerContext(ContainerRequest(pod_uid="u", pod_labels={"koordinator.sh/qosClass": "LS"}))
    assert hooks.reconcile_container(be) == {}
    hooks.reconcile_container(ls)
    assert (be.response.resources.cpu_shares, ls.response.resources.cpu_shares) == (7, None)
    sandbox = ContainerContext(ContainerRequest(pod_uid="u", sandbox=True, pod_labels=BE_LABELS))
    hooks.reconcile_container(sandbox)
    assert sandbox.response.resources.cpu_shares is None  # no sandbox-level reconciler declared
    kq = KubeQoSContext(KubeQoS.BESTEFFORT, "kubepods/besteffort")
    hooks.reconcile_kube_qos(kq)
    assert kq.response.resources.cpu_idle == 1
    hooks.reconcile_pod(PodContext(PodRequest(uid="u", labels=BE_LABELS)))  # none at pod level: no error
    # rules: a new NodeSLO object and a new Node object reach the plugin once each
    slo, node = NodeSLO(), NodeInfo(name="n")
    assert hooks.refresh_rules(slo, node) == {"Marker"}
    assert hooks.refresh_rules(slo, node) == set()
    assert marker.slo_updates == 1
    assert marker.node_ratios == [-1.0]  # no ratio annotation: -1


def test_a_hook_whose_gate_is_off_is_not_built() -> None:
    hooks = RuntimeHooks(HookOptions(gates={}), specs=(MARKER,))
    assert hooks.names == []
    assert hooks.get(Marker) is None
    assert hooks.registry.stages() == []
