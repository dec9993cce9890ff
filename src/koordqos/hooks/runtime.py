"""RuntimeHooks: the enabled hook plugins, their stage registry, their rules and the reconcile dispatch.

Built once from the feature gates (koordlet's names and defaults: BatchResource, GroupIdentity and
CPUSetAllocator on). Used by the NRI conversion, the proxy hook service and the reconciler alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from koordqos import observability as obs
from koordqos.hooks.batchresource import BatchResource
from koordqos.hooks.context import (
    ContainerContext,
    HostAppContext,
    KubeQoSContext,
    PodContext,
    Stage,
    qos_from_labels,
)
from koordqos.hooks.coresched import CoreSched
from koordqos.hooks.cpunormalization import CPUNormalization
from koordqos.hooks.cpuset import CPUSetAllocator
from koordqos.hooks.cpusetutil import has_pinned_cpuset
from koordqos.hooks.framework import FailurePolicy, HookRegistry, StageResult, run_hooks
from koordqos.hooks.groupidentity import BvtSystem, GroupIdentity
from koordqos.hooks.oomscoreadj import OOMScoreAdj
from koordqos.hooks.rules import (
    RatioIgnored,
    RuleError,
    cpu_normalization_ratio,
    slo_view,
    topology_view,
)
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.qos import QoSClass
from koordqos.once import SeenOnce

log = structlog.get_logger("koordqos.hooks")

MAX_REPORTED = 1024  # distinct rule errors remembered for log-once; forgotten all at once beyond this


def pod_qos_condition(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """koordlet PodQOSFilter: the raw QoS label; no label but a scheduler cpuset counts as LSR."""
    qos = qos_from_labels(labels)
    if qos is QoSClass.NONE and has_pinned_cpuset(annotations):
        return QoSClass.LSR.value
    return qos.value


@dataclass(frozen=True, slots=True)
class Reconciler:
    """One reconcile function with the pod-QoS conditions it runs under (None: every pod)."""

    plugin: str
    resource: str
    fn: Callable[[Any], None]
    conditions: frozenset[str] | None = None

    def applies(self, condition: str) -> bool:
        """Whether this reconciler runs for a pod with `condition`."""
        return self.conditions is None or condition in self.conditions


@dataclass
class HookOptions:
    """Construction options (from config and the node's capabilities)."""

    gates: Mapping[str, bool] = field(default_factory=dict)
    disable_unset_cpu_quota: bool = False
    bvt: BvtSystem = field(default_factory=BvtSystem)
    core_sched_supported: bool = False
    core_sched_reason: str = "not probed"
    cookie_ops: Any = None


def _gate(gates: Mapping[str, bool], name: str) -> bool:
    from koordqos.features import DEFAULT_GATES

    return gates.get(name, DEFAULT_GATES.get(name, False))


class RuntimeHooks:
    """The enabled plugins and everything that dispatches to them."""

    def __init__(self, options: HookOptions | None = None) -> None:
        opts = options or HookOptions()
        g = opts.gates
        self.registry = HookRegistry()
        self.batch = BatchResource() if _gate(g, "BatchResource") else None
        self.group_identity = GroupIdentity(opts.bvt) if _gate(g, "GroupIdentity") else None
        self.cpuset = (
            CPUSetAllocator(opts.disable_unset_cpu_quota, _gate(g, "BECPUManager"))
            if _gate(g, "CPUSetAllocator")
            else None
        )
        self.cpu_normalization = CPUNormalization() if _gate(g, "CPUNormalization") else None
        self.oom = OOMScoreAdj() if _gate(g, "OOMScoreAdj") else None
        self.core_sched = (
            CoreSched(opts.core_sched_supported, opts.core_sched_reason, opts.cookie_ops)
            if _gate(g, "CoreSched")
            else None
        )
        self.pending_updates: set[str] = set()  # rule changes not yet reconciled
        self._slo: NodeSLO | bool | None = False  # False: never seen
        self._node: NodeInfo | bool | None = False
        self._reported: SeenOnce[str] = SeenOnce(MAX_REPORTED)  # rule error texts already logged
        self.pod_reconcilers: list[Reconciler] = []
        self.container_reconcilers: list[Reconciler] = []
        self.sandbox_reconcilers: list[Reconciler] = []
        self.kube_qos_reconcilers: list[Reconciler] = []
        self.host_app_reconcilers: list[Reconciler] = []  # one per resource (§1.7)
        for plugin in self.plugins:
            for stage, (desc, fn) in plugin.stage_hooks().items():
                self.registry.register(stage, plugin.name, desc, fn)
        self._register_reconcilers()

    @property
    def plugins(self) -> list[Any]:
        """Enabled plugins, by name."""
        found = [
            self.batch,
            self.cpu_normalization,
            self.cpuset,
            self.core_sched,
            self.group_identity,
            self.oom,
        ]
        return sorted((p for p in found if p is not None), key=lambda p: p.name)

    @property
    def names(self) -> list[str]:
        """Names of the enabled plugins."""
        return [p.name for p in self.plugins]

    def _register_reconcilers(self) -> None:
        be = frozenset({"BE"})
        pinned = frozenset({"LSE", "LSR"})
        share = frozenset({"LS", ""})
        unpinned = frozenset({"LS", "BE", "SYSTEM", ""})
        if self.batch is not None:
            b = self.batch
            self.pod_reconcilers += [
                Reconciler(b.name, "cpu.shares", b.set_pod_cpu_shares, be),
                Reconciler(b.name, "cpu.cfs_quota_us", b.set_pod_cfs_quota, be),
                Reconciler(b.name, "memory.limit_in_bytes", b.set_pod_memory_limit, be),
            ]
            self.container_reconcilers.append(Reconciler(b.name, "batch", b.set_container_resources, be))
        if self.cpuset is not None:
            c = self.cpuset
            self.pod_reconcilers.append(Reconciler(c.name, "cpu.cfs_quota_us", c.unset_pod_cpu_quota, pinned))
            for lst in (self.container_reconcilers, self.sandbox_reconcilers):
                lst.append(Reconciler(c.name, "cpuset.cpus", c.set_cpuset_and_unset_cfs, pinned))
                lst.append(Reconciler(c.name, "cpuset.cpus", c.set_container_cpuset, unpinned))
            self.host_app_reconcilers.append(Reconciler(c.name, "cpuset.cpus", c.set_host_app_cpuset))
        if self.cpu_normalization is not None:
            n = self.cpu_normalization
            self.pod_reconcilers.append(Reconciler(n.name, "cpu.cfs_quota_us", n.adjust_pod_cfs_quota, share))
            self.container_reconcilers.append(
                Reconciler(n.name, "cpu.cfs_quota_us", n.adjust_container_cfs_quota, share)
            )
        if self.group_identity is not None:
            gi = self.group_identity
            self.pod_reconcilers.append(Reconciler(gi.name, "cpu.bvt_warp_ns", gi.set_pod_bvt_value))
            self.kube_qos_reconcilers.append(
                Reconciler(gi.name, "cpu.bvt_warp_ns", gi.set_kube_qos_bvt_value)
            )
            self.host_app_reconcilers.append(
                Reconciler(gi.name, "cpu.bvt_warp_ns", gi.set_host_app_bvt_value)
            )
        if self.core_sched is not None:
            self.kube_qos_reconcilers.append(
                Reconciler(self.core_sched.name, "cpu.idle", self.core_sched.set_kube_qos_cpu_idle)
            )

    # -- rules ------------------------------------------------------------------------------------

    def refresh_rules(self, slo: NodeSLO | None, node: NodeInfo | None) -> set[str]:
        """Re-parse rules whose input object changed; return the names of plugins whose rule changed."""
        updated: set[str] = set()
        if slo is not self._slo:
            self._slo = slo
            view = slo_view(slo)
            if self.batch is not None and self.batch.rule.update_cfs_quota(
                view.be_threshold_enable, view.cpu_suppress_policy
            ):
                updated.add(self.batch.name)
            if self.group_identity is not None and self.group_identity.update_rule(view):
                updated.add(self.group_identity.name)
            if self.core_sched is not None and self.core_sched.update_rule(view):
                updated.add(self.core_sched.name)
        if node is not self._node:
            self._node = node
            annotations = node.annotations if node is not None else {}
            if node is not None:
                ratio: float | None
                try:
                    ratio = cpu_normalization_ratio(node)
                except RatioIgnored as exc:
                    self._report("node cpu-normalization ratio ignored", exc)
                    ratio = -1.0
                except RuleError as exc:
                    self._report("node rule not updated", exc)
                    ratio = None
                if ratio is not None:
                    if self.batch is not None and self.batch.rule.update_ratio(ratio):
                        updated.add(self.batch.name)
                    if self.cpu_normalization is not None and self.cpu_normalization.update_rule(ratio):
                        updated.add(self.cpu_normalization.name)
            if self.cpuset is not None and node is not None:
                try:
                    if self.cpuset.update_rule(topology_view(annotations)):
                        updated.add(self.cpuset.name)
                except RuleError as exc:
                    self._report("cpuset rule not updated", exc)
        self.pending_updates |= updated
        return updated

    def _report(self, message: str, exc: RuleError) -> None:
        """Count a bad node annotation every time it is parsed; log each distinct error once."""
        obs.ERRORS.labels("hooks", "bad_node_annotation").inc()
        text = f"{message}: {exc}"
        if self._reported.first(text):
            log.warning(message, error=str(exc))

    def take_updates(self) -> set[str]:
        """Plugins whose rule changed since the last call (the reconciler re-applies their settings)."""
        out = self.pending_updates
        self.pending_updates = set()
        return out

    # -- running ----------------------------------------------------------------------------------

    def run_stage(
        self, stage: Stage, ctx: PodContext | ContainerContext, policy: FailurePolicy
    ) -> StageResult:
        """Run a stage's hooks on `ctx` (name order, failure policy)."""
        return run_hooks(self.registry, policy, stage, ctx)

    def _reconcile(self, reconcilers: list[Reconciler], condition: str, ctx: Any) -> dict[str, str]:
        errors: dict[str, str] = {}
        for r in reconcilers:
            if not r.applies(condition):
                continue
            try:
                r.fn(ctx)
            except Exception as exc:
                errors[f"{r.plugin}/{r.resource}"] = f"{type(exc).__name__}: {exc}"
        return errors

    def reconcile_pod(self, ctx: PodContext) -> dict[str, str]:
        """Run the pod-level reconcilers that apply to the pod; returns errors by plugin/resource."""
        cond = pod_qos_condition(ctx.request.labels, ctx.request.annotations)
        return self._reconcile(self.pod_reconcilers, cond, ctx)

    def reconcile_container(self, ctx: ContainerContext) -> dict[str, str]:
        """Run the container-level (or, for sandboxes, sandbox-level) reconcilers."""
        cond = pod_qos_condition(ctx.request.pod_labels, ctx.request.pod_annotations)
        lst = self.sandbox_reconcilers if ctx.request.sandbox else self.container_reconcilers
        return self._reconcile(lst, cond, ctx)

    def reconcile_kube_qos(self, ctx: KubeQoSContext) -> dict[str, str]:
        """Run the kube-QoS-dir reconcilers."""
        return self._reconcile(self.kube_qos_reconcilers, "", ctx)

    def reconcile_host_app(self, ctx: HostAppContext) -> dict[str, str]:
        """Run the host-application reconcilers (cpuset, then bvt)."""
        return self._reconcile(self.host_app_reconcilers, "", ctx)
