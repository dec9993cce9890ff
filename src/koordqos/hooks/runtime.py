"""RuntimeHooks: the enabled hook plugins, their stage table, their rules and the reconcile dispatch.

Built once from the feature gates (koordlet's names and defaults: BatchResource, GroupIdentity and
CPUSetAllocator on) out of `hooks/registry.py`. Used by the hook core (NRI and proxy calls) and the
reconciler alike; nothing here knows a particular hook beyond the typed shortcuts at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import structlog

from koordqos import observability as obs
from koordqos.hooks.batchresource import BatchResource
from koordqos.hooks.context import (
    ContainerContext,
    HostAppContext,
    KubeQoSContext,
    PodContext,
    qos_from_labels,
)
from koordqos.hooks.coresched import CoreSched
from koordqos.hooks.cpunormalization import CPUNormalization
from koordqos.hooks.cpuset import CPUSetAllocator
from koordqos.hooks.cpusetutil import has_pinned_cpuset
from koordqos.hooks.framework import HookPlugin, HookRegistry, HookSpec, Level, Reconciler
from koordqos.hooks.groupidentity import GroupIdentity
from koordqos.hooks.oomscoreadj import OOMScoreAdj
from koordqos.hooks.options import HookOptions
from koordqos.hooks.registry import HOOKS
from koordqos.hooks.rules import (
    NodeRules,
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
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.hooks")

MAX_REPORTED = 1024  # distinct rule errors remembered for log-once; forgotten all at once beyond this

__all__ = ["HookOptions", "Reconciler", "RuntimeHooks", "pod_qos_condition"]

T = TypeVar("T", bound=HookPlugin)

#: NodeState → the NodeResourceTopology annotations computed from it (None: cannot be computed yet)
TopologySource = Callable[[NodeState], Mapping[str, str] | None]


def pod_qos_condition(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """koordlet PodQOSFilter: the raw QoS label; no label but a scheduler cpuset counts as LSR."""
    qos = qos_from_labels(labels)
    if qos is QoSClass.NONE and has_pinned_cpuset(annotations):
        return QoSClass.LSR.value
    return qos.value


class RuntimeHooks:
    """The enabled plugins and everything that dispatches to them."""

    def __init__(
        self, options: HookOptions | None = None, specs: tuple[HookSpec[HookPlugin], ...] = HOOKS
    ) -> None:
        opts = options or HookOptions()
        self.registry = HookRegistry()
        # registry order; the enabled ones only
        self._plugins: list[HookPlugin] = [spec.build(opts) for spec in specs if opts.gate(spec.gate)]
        self.pending_updates: set[str] = set()  # rule changes not yet reconciled
        self._slo: NodeSLO | bool | None = False  # False: never seen
        self._node: NodeInfo | bool | None = False
        self._reported: SeenOnce[str] = SeenOnce(MAX_REPORTED)  # rule error texts already logged
        # the share pools' one computation (the NRT reporter's), of the state the caller plans from; set by
        # the agent when it reports the NRT (`refresh`)
        self.topology_source: TopologySource | None = None
        self._topology_seen: Mapping[str, str] | None = None  # the annotations last taken from it
        self.reconcilers: dict[Level, list[Reconciler]] = {level: [] for level in Level}
        for plugin in self._plugins:
            for stage, (desc, fn) in plugin.stage_hooks().items():
                self.registry.register(stage, plugin.name, desc, fn)
            for r in plugin.reconcilers():
                self.reconcilers[r.level].append(
                    Reconciler(r.level, r.resource, r.fn, r.conditions, r.plugin or plugin.name)
                )

    @property
    def plugins(self) -> list[HookPlugin]:
        """Enabled plugins, by name."""
        return sorted(self._plugins, key=lambda p: p.name)

    @property
    def names(self) -> list[str]:
        """Names of the enabled plugins."""
        return [p.name for p in self.plugins]

    def get(self, cls: type[T]) -> T | None:
        """The enabled plugin of class `cls`, if any."""
        for p in self._plugins:
            if isinstance(p, cls):
                return p
        return None

    # -- rules ------------------------------------------------------------------------------------

    def refresh_rules(self, slo: NodeSLO | None, node: NodeInfo | None) -> set[str]:
        """Re-parse rules whose input object changed; return the names of plugins whose rule changed."""
        updated: set[str] = set()
        if slo is not self._slo:
            self._slo = slo
            view = slo_view(slo)
            updated.update(p.name for p in self._plugins if p.update_slo(view))
        if node is not self._node:
            self._node = node
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
                rules = NodeRules(ratio, node.annotations)
                for p in self._plugins:
                    try:
                        if p.update_node(rules):
                            updated.add(p.name)
                    except RuleError as exc:
                        self._report(f"{p.name} rule not updated", exc)
        self.pending_updates |= updated
        return updated

    def refresh(self, state: NodeState) -> set[str]:
        """`refresh_rules` from `state`, and the CPUSetAllocator's share pools computed from the same `state`
        (`topology_source`): a reconcile pass and the NRI Synchronize plan from rules of the state they
        plan, so both give a container the same cpuset. Returns the plugins whose rule changed."""
        updated = self.refresh_rules(state.node_slo, state.node)
        source = self.topology_source
        if source is not None:
            annotations = source(state)
            # the source memoises its result: the same object means the same pools, nothing to parse
            if annotations is not None and annotations is not self._topology_seen:
                self._topology_seen = annotations
                cpuset = self.cpuset
                if self.update_topology(annotations) and cpuset is not None:
                    updated.add(cpuset.name)
        return updated

    def update_topology(self, annotations: Mapping[str, str]) -> bool:
        """The agent's NodeResourceTopology annotations changed: the CPUSetAllocator takes its share pools
        from them (RuleError is logged once and the rule kept); True when a rule changed."""
        cpuset = self.cpuset
        if cpuset is None:
            return False
        try:
            changed = cpuset.update_topology(topology_view(annotations))
        except RuleError as exc:
            self._report(f"{cpuset.name} rule not updated", exc)
            return False
        if changed:
            self.pending_updates.add(cpuset.name)
        return changed

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

    # -- reconciling -----------------------------------------------------------------------------

    def _reconcile(self, level: Level, condition: str, ctx: Any) -> dict[str, str]:
        errors: dict[str, str] = {}
        for r in self.reconcilers[level]:
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
        return self._reconcile(Level.POD, cond, ctx)

    def reconcile_container(self, ctx: ContainerContext) -> dict[str, str]:
        """Run the container-level (or, for sandboxes, sandbox-level) reconcilers."""
        cond = pod_qos_condition(ctx.request.pod_labels, ctx.request.pod_annotations)
        return self._reconcile(Level.SANDBOX if ctx.request.sandbox else Level.CONTAINER, cond, ctx)

    def reconcile_kube_qos(self, ctx: KubeQoSContext) -> dict[str, str]:
        """Run the kube-QoS-dir reconcilers."""
        return self._reconcile(Level.KUBE_QOS, "", ctx)

    def reconcile_host_app(self, ctx: HostAppContext) -> dict[str, str]:
        """Run the host-application reconcilers (cpuset, then bvt)."""
        return self._reconcile(Level.HOST_APP, "", ctx)

    # -- typed shortcuts (the reconciler's own steps and tests reach these plugins) ----------------

    @property
    def batch(self) -> BatchResource | None:
        """BatchResource, when enabled."""
        return self.get(BatchResource)

    @property
    def cpuset(self) -> CPUSetAllocator | None:
        """CPUSetAllocator, when enabled."""
        return self.get(CPUSetAllocator)

    @property
    def cpu_normalization(self) -> CPUNormalization | None:
        """CPUNormalization, when enabled."""
        return self.get(CPUNormalization)

    @property
    def group_identity(self) -> GroupIdentity | None:
        """GroupIdentity, when enabled."""
        return self.get(GroupIdentity)

    @property
    def oom(self) -> OOMScoreAdj | None:
        """OOMScoreAdj, when enabled."""
        return self.get(OOMScoreAdj)

    @property
    def core_sched(self) -> CoreSched | None:
        """CoreSched, when enabled."""
        return self.get(CoreSched)
