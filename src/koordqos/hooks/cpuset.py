"""CPUSetAllocator: container cpusets from the scheduler's allocation or the share pools; unset quota of
cpuset-pinned pods (docs/behaviour-runtime-hooks.md, "CPUSetAllocator")."""

from __future__ import annotations

from collections.abc import Mapping

from koordqos.hooks.context import ContainerContext, HostAppContext, PodContext, Stage
from koordqos.hooks.cpusetutil import parse_resource_status
from koordqos.hooks.framework import PINNED, UNPINNED, HookFn, HookPlugin, HookSpec, Level, Reconciler
from koordqos.hooks.options import HookOptions
from koordqos.hooks.rules import CPUSharePool, NodeRules, TopologyView
from koordqos.model.qos import KubeQoS, QoSClass

NAME = "CPUSetAllocator"
GATE = "CPUSetAllocator"


def _join(pools: tuple[CPUSharePool, ...]) -> str:
    return ",".join(p.cpuset for p in pools)


class CPUSetAllocator(HookPlugin):
    """The hook plugin; `rule` is None until the first topology update."""

    name = NAME
    gate = GATE

    def __init__(self, disable_unset_cpu_quota: bool = False, be_cpu_manager: bool = False) -> None:
        self.rule: TopologyView | None = None
        self.disable_unset_cpu_quota = disable_unset_cpu_quota
        self.be_cpu_manager = be_cpu_manager
        # True once the agent's own NodeResourceTopology computation feeds the rule (koordlet reads the NRT's
        # annotations); from then on the Node's annotations no longer replace it
        self.from_topology = False

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {
            Stage.PRE_RUN_POD_SANDBOX: ("unset pod cpu quota if needed", self.unset_pod_cpu_quota),
            Stage.PRE_CREATE_CONTAINER: (
                "set container cpuset and unset quota",
                self.set_cpuset_and_unset_cfs,
            ),
            Stage.PRE_UPDATE_CONTAINER_RESOURCES: (
                "set container cpuset and unset quota",
                self.set_cpuset_and_unset_cfs,
            ),
        }

    def reconcilers(self) -> list[Reconciler]:
        """Pinned pods: quota unset; container and sandbox cpusets; host application cpusets."""
        out = [Reconciler(Level.POD, "cpu.cfs_quota_us", self.unset_pod_cpu_quota, PINNED)]
        for level in (Level.CONTAINER, Level.SANDBOX):
            out.append(Reconciler(level, "cpuset.cpus", self.set_cpuset_and_unset_cfs, PINNED))
            out.append(Reconciler(level, "cpuset.cpus", self.set_container_cpuset, UNPINNED))
        out.append(Reconciler(Level.HOST_APP, "cpuset.cpus", self.set_host_app_cpuset))
        return out

    def update_node(self, node: NodeRules) -> bool:
        """Before the topology computation runs: share pools, kubelet policy and SYSTEM cpuset from the Node's
        annotations (where an operator may have put them); afterwards the computation is the source."""
        if self.from_topology:
            return False
        return self.update_rule(node.topology())

    def update_topology(self, view: TopologyView) -> bool:
        """The rule from the agent's NodeResourceTopology annotations (share pools of the same computation
        the NRT reports); True when it changed."""
        self.from_topology = True
        return self.update_rule(view)

    def update_rule(self, view: TopologyView) -> bool:
        """Take new topology inputs; True when they differ from the current rule."""
        if self.rule == view:
            return False
        self.rule = view
        return True

    def set_container_cpuset(self, ctx: ContainerContext | None) -> None:
        """Scheduler cpuset if any, else (with a rule) the share-pool cpuset for the pod's QoS."""
        if ctx is None:
            raise ValueError("nil container context")
        req = ctx.request
        status = parse_resource_status(req.pod_annotations)  # ValueError on bad JSON
        if status is not None and status.cpuset:
            ctx.response.resources.cpuset = status.cpuset
            return
        if self.rule is None:
            return
        cpuset = self._container_cpuset(ctx)
        if cpuset is not None:
            ctx.response.resources.cpuset = cpuset

    def _container_cpuset(self, ctx: ContainerContext) -> str | None:
        rule = self.rule
        assert rule is not None
        req = ctx.request
        qos = req.qos
        status = parse_resource_status(req.pod_annotations)
        numa = [] if status is None else [n for n in status.numa_nodes if n.cpu > 0 or n.batch_cpu > 0]
        if numa:
            pools: tuple[CPUSharePool, ...] | None = None
            if qos is QoSClass.BE and self.be_cpu_manager:
                pools = rule.be_share_pools
            elif qos is not QoSClass.BE:
                pools = rule.share_pools
            if pools is not None:
                return ",".join(p.cpuset for n in numa for p in pools if p.node == n.node)
        if qos is QoSClass.SYSTEM and rule.system_qos_cpuset:
            return rule.system_qos_cpuset
        if qos is QoSClass.LS:
            return _join(rule.share_pools)
        if req.kube_qos is KubeQoS.BESTEFFORT:
            return ""  # clears the cpuset so it does not conflict with the kubelet static policy
        if rule.kubelet_policy == "static":
            return None
        return _join(rule.share_pools)

    def unset_pod_cpu_quota(self, ctx: PodContext | None) -> None:
        """Quota -1 for pods pinned to a cpuset (avoids throttling them)."""
        if ctx is None:
            raise ValueError("nil pod context")
        if self._should_unset(ctx.request.annotations):
            ctx.response.resources.cfs_quota = -1

    def unset_container_cpu_quota(self, ctx: ContainerContext) -> None:
        """Container quota -1 for pods pinned to a cpuset."""
        if self._should_unset(ctx.request.pod_annotations):
            ctx.response.resources.cfs_quota = -1

    def _should_unset(self, annotations: Mapping[str, str]) -> bool:
        if self.disable_unset_cpu_quota:
            return False
        status = parse_resource_status(annotations)
        return status is not None and bool(status.cpuset)

    def set_cpuset_and_unset_cfs(self, ctx: ContainerContext | None) -> None:
        """SetContainerCPUSet, then (when it succeeded) UnsetContainerCPUQuota."""
        self.set_container_cpuset(ctx)
        assert ctx is not None
        self.unset_container_cpu_quota(ctx)

    def host_app_cpuset(self, qos: QoSClass) -> str | None:
        """Host application cpuset: LS only (all share pools); None without a rule."""
        if self.rule is None:
            return None
        if qos is not QoSClass.LS:
            raise ValueError(f"host application qos {qos.value or 'None'}: only LS is supported")
        return _join(self.rule.share_pools)

    def set_host_app_cpuset(self, ctx: HostAppContext) -> None:
        """Host application cpuset (SetHostAppCPUSet); ValueError for a QoS other than LS."""
        cpuset = self.host_app_cpuset(ctx.request.qos)
        if cpuset is not None:
            ctx.response.resources.cpuset = cpuset


def _build(opts: HookOptions) -> CPUSetAllocator:
    return CPUSetAllocator(opts.disable_unset_cpu_quota, opts.gate("BECPUManager"))


HOOK: HookSpec[CPUSetAllocator] = HookSpec(NAME, GATE, _build)
