"""NRI messages ↔ hook contexts (runtime-hooks.md §4), registered on the NRI plugin's bus request events.

* RunPodSandbox → PreRunPodSandbox on a PodContext; the pod-level values (bvt, idle, shares, quota,
  memory) are written to the pod cgroup through the executor before the reply.
* CreateContainer → PreCreateContainer; the result goes into the `ContainerAdjustment` (cpu shares,
  quota, cpuset, memory limit, env, oom_score_adj).
* UpdateContainer → PreUpdateContainerResources on the resources the runtime is about to apply
  (falling back to the container's current ones); a `ContainerUpdate` naming the container, only when a
  resource field was set (project decision §8.4).
* Synchronize → for every CREATED/RUNNING/PAUSED container, PreUpdateContainerResources on its current
  resources; an update for each container whose values differ (project decision §4).
* RemovePodSandbox → drop the executor's cached values for the pod's cgroups.

Under the Fail policy a hook error fails the call before anything is written or returned. Pods known
from the API server contribute their spec (batch resources); pods seen only through NRI use their
annotations, so both go through the same hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.cgroups.layout import CgroupLayout
from koordqos.decisions import DecisionLog
from koordqos.errors import CgroupError
from koordqos.events.bus import EventBus
from koordqos.hooks.completion import pod_writes
from koordqos.hooks.context import (
    ContainerContext,
    ContainerRequest,
    PodContext,
    PodRequest,
    Stage,
    pod_extended,
)
from koordqos.hooks.framework import FailurePolicy
from koordqos.hooks.resources import (
    ExtendedResourceSpec,
    ExtendedResourceSpecError,
    Resources,
    extended_from_annotation,
)
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.events import (
    NRICreateContainer,
    NRIRemovePodSandbox,
    NRIRunPodSandbox,
    NRISynchronize,
    NRIUpdateContainer,
)
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.nri.convert")

HOOK_NAME = "koordqos-runtime-hooks"
STRATEGY = "runtime-hooks"
ANNOTATION_DOCKER_TYPE = "io.kubernetes.docker.type"
_LIVE_STATES = frozenset({api.CONTAINER_CREATED, api.CONTAINER_RUNNING, api.CONTAINER_PAUSED})

CONVERT_ERRORS = Counter(
    "koordqos_nri_convert_errors_total",
    "NRI data the hooks could not use (bad paths, annotations)",
    ["kind"],
    registry=obs.REGISTRY,
)


def resources_from_nri(res: api.LinuxResources | None) -> Resources | None:
    """koordlet FromNriLinuxResources: set values only (0 / "" mean not specified); None without resources."""
    if res is None:
        return None
    out = Resources()
    if res.HasField("cpu"):
        cpu = res.cpu
        if cpu.HasField("shares") and cpu.shares.value != 0:
            out.cpu_shares = int(cpu.shares.value)
        if cpu.HasField("quota") and cpu.quota.value != 0:
            out.cfs_quota = int(cpu.quota.value)
        if cpu.cpus:
            out.cpuset = cpu.cpus
    if res.HasField("memory") and res.memory.HasField("limit") and res.memory.limit.value != 0:
        limit = int(res.memory.limit.value)
        out.memory_limit = limit if limit > 0 else -1
    return out


def envs_from_nri(env: Any) -> dict[str, str]:
    """`KEY=VALUE` strings → dict; entries with an empty key or value are dropped (koordlet)."""
    out: dict[str, str] = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep and key and value:
            out[key] = value
    return out


class NRIHooks:
    """Converts NRI request events to hook contexts, runs the stages and fills the replies."""

    def __init__(
        self,
        hooks: RuntimeHooks,
        layout: CgroupLayout,
        executor: CgroupExecutor | None,
        policy: FailurePolicy = "Ignore",
        default_runtime: str = "containerd",
        decisions: DecisionLog | None = None,
    ) -> None:
        self.decisions = decisions if decisions is not None else DecisionLog()
        self.hooks = hooks
        self.layout = layout
        self.executor = executor
        self.policy = policy
        self.default_runtime = default_runtime
        self._warned: SeenOnce[str] = SeenOnce()
        self._dirs: dict[str, str] = {}  # runtime cgroup parent → checked relative dir

    def _normalize(self, parent: str) -> str:
        # memoised: every container of a pod repeats the pod's parent, and the path checks are not free
        rel = self._dirs.get(parent)
        if rel is None:
            rel = self.layout.normalize_parent(parent)
            if len(self._dirs) >= 8192:
                self._dirs.clear()
            self._dirs[parent] = rel
        return rel

    def register(self, bus: EventBus) -> None:
        """Attach to the NRI request events."""
        bus.register_hook(NRIRunPodSandbox, HOOK_NAME, self.run_pod_sandbox)
        bus.register_hook(NRICreateContainer, HOOK_NAME, self.create_container)
        bus.register_hook(NRIUpdateContainer, HOOK_NAME, self.update_container)
        bus.register_hook(NRISynchronize, HOOK_NAME, self.synchronize)
        bus.register_hook(NRIRemovePodSandbox, HOOK_NAME, self.remove_pod_sandbox)

    # -- conversion -------------------------------------------------------------------------------

    def _bad(self, kind: str, what: str, exc: Exception) -> None:
        CONVERT_ERRORS.labels(kind).inc()
        key = f"{kind}:{what}:{exc}"
        if self._warned.first(key):
            log.warning("NRI data not usable by the hooks", kind=kind, target=what, error=str(exc))

    def _pod_dir(self, pod: api.PodSandbox) -> str:
        parent = pod.linux.cgroup_parent if pod.HasField("linux") else ""
        if not parent:
            return ""  # project decision: a missing pod.linux is an empty parent
        try:
            return self._normalize(parent)
        except CgroupError as exc:
            self._bad("cgroup_parent", f"{pod.namespace}/{pod.name}", exc)
            return ""

    def _extended(self, pod: api.PodSandbox, state: NodeState) -> ExtendedResourceSpec | None:
        known = state.pods.get(pod.uid)
        try:
            if known is not None:
                return pod_extended(known)
            return extended_from_annotation(pod.annotations)
        except ExtendedResourceSpecError as exc:
            self._bad("extended_resource_spec", f"{pod.namespace}/{pod.name}", exc)
            return None

    def pod_context(self, pod: api.PodSandbox, state: NodeState) -> PodContext:
        """PodContext.FromNri."""
        return PodContext(
            PodRequest(
                uid=pod.uid,
                namespace=pod.namespace,
                name=pod.name,
                labels=dict(pod.labels),
                annotations=dict(pod.annotations),
                cgroup_parent=self._pod_dir(pod),
                extended=self._extended(pod, state),
            ),
            source="nri",
        )

    def container_context(
        self,
        pod: api.PodSandbox,
        ctr: api.Container,
        state: NodeState,
        resources: api.LinuxResources | None = None,
        pod_dir: str | None = None,
        extended: ExtendedResourceSpec | bool | None = False,
    ) -> ContainerContext:
        """ContainerContext.FromNri (`resources` overrides the container's own)."""
        annotations: Mapping[str, str] = pod.annotations
        runtime = "docker" if ANNOTATION_DOCKER_TYPE in annotations else self.default_runtime
        container_id = f"{runtime}://{ctr.id}"
        pdir = self._pod_dir(pod) if pod_dir is None else pod_dir
        cdir = ""
        try:
            if ctr.linux.cgroups_path:
                cdir = self._normalize(ctr.linux.cgroups_path)
            elif pdir:
                cdir = self.layout.container_dir_in(pdir, container_id)
        except CgroupError as exc:
            self._bad("cgroups_path", f"{pod.namespace}/{pod.name}/{ctr.name}", exc)
        ext = self._extended(pod, state) if extended is False else extended
        if resources is None and ctr.HasField("linux") and ctr.linux.HasField("resources"):
            resources = ctr.linux.resources
        return ContainerContext(
            ContainerRequest(
                pod_uid=pod.uid,
                container_name=ctr.name,
                container_id=container_id,
                pod_namespace=pod.namespace,
                pod_name=pod.name,
                pod_labels=dict(pod.labels),
                pod_annotations=dict(annotations),
                pod_cgroup_parent=pdir,
                cgroup_parent=cdir,
                envs=envs_from_nri(ctr.env),
                resources=resources_from_nri(resources),
                extended=ext.containers.get(ctr.name) if isinstance(ext, ExtendedResourceSpec) else None,
            ),
            source="nri",
        )

    def _record(self, ctx: ContainerContext, action: str, new: str, call: str) -> bool:
        """Log the reply as a decision; False in dry-run (the runtime then gets nothing)."""
        r = ctx.request
        dry = self.decisions.dry_run
        self.decisions.record(
            STRATEGY,
            f"{r.pod_namespace}/{r.pod_name}/{r.container_name}",
            f"nri-{action}",
            None,
            new,
            call,
            dry_run=dry,
            quiet=True,
        )
        return not dry

    # -- handlers ---------------------------------------------------------------------------------

    async def run_pod_sandbox(self, event: NRIRunPodSandbox, state: NodeState) -> None:
        """Run the pod stage and write the pod cgroups before the reply."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        ctx = self.pod_context(event.pod, state)
        self.hooks.run_stage(Stage.PRE_RUN_POD_SANDBOX, ctx, self.policy)
        writes = pod_writes(ctx)
        if writes and self.executor is not None:
            await self.executor.apply(
                STRATEGY, writes, reason=f"RunPodSandbox {event.pod.namespace}/{event.pod.name}"
            )

    def create_container(self, event: NRICreateContainer, state: NodeState) -> None:
        """Run PreCreateContainer and fill the adjustment."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        ctx = self.container_context(event.pod, event.container, state)
        self.hooks.run_stage(Stage.PRE_CREATE_CONTAINER, ctx, self.policy)
        resp = ctx.response
        if not (nri_visible(resp.resources) or resp.add_envs or resp.oom_score_adj is not None):
            return
        if self._record(ctx, "adjust", _summary(resp.resources, resp.oom_score_adj), "CreateContainer"):
            fill_adjustment(event.adjust, ctx)

    def update_container(self, event: NRIUpdateContainer, state: NodeState) -> None:
        """Run PreUpdateContainerResources on the requested resources; update this container if set."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        requested = event.linux_resources if event.linux_resources.ByteSize() > 0 else None
        ctx = self.container_context(event.pod, event.container, state, requested)
        self.hooks.run_stage(Stage.PRE_UPDATE_CONTAINER_RESOURCES, ctx, self.policy)
        res = ctx.response.resources
        if nri_visible(res) and self._record(ctx, "update", _summary(res), "UpdateContainer"):
            fill_resources(event.update_for(event.container.id).linux.resources, res)

    def synchronize(self, event: NRISynchronize, state: NodeState) -> None:
        """Correct every live container whose hook values differ from what it has."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        pods = {p.id: p for p in event.pods}
        pod_dirs: dict[str, str] = {}
        extended: dict[str, ExtendedResourceSpec | None] = {}
        for ctr in event.containers:
            if ctr.state not in _LIVE_STATES:
                continue
            pod = pods.get(ctr.pod_sandbox_id)
            if pod is None:
                continue
            if pod.id not in pod_dirs:
                pod_dirs[pod.id] = self._pod_dir(pod)
                extended[pod.id] = self._extended(pod, state)
            ctx = self.container_context(pod, ctr, state, None, pod_dirs[pod.id], extended[pod.id])
            self.hooks.run_stage(Stage.PRE_UPDATE_CONTAINER_RESOURCES, ctx, self.policy)
            diff = differing(ctx.response.resources, ctx.request.resources)
            if nri_visible(diff) and self._record(ctx, "update", _summary(diff), "Synchronize"):
                fill_resources(event.update_for(ctr.id).linux.resources, diff)

    def remove_pod_sandbox(self, event: NRIRemovePodSandbox, state: NodeState) -> None:
        """Forget cached cgroup values of the removed pod."""
        pod_dir = self._pod_dir(event.pod)
        if pod_dir and self.executor is not None:
            self.executor.invalidate(pod_dir)


def _summary(res: Resources, oom: int | None = None) -> str:
    parts = [
        f"{k}={v}"
        for k, v in (
            ("shares", res.cpu_shares),
            ("quota", res.cfs_quota),
            ("cpus", res.cpuset),
            ("memory", res.memory_limit),
            ("oom_score_adj", oom),
        )
        if v is not None
    ]
    return " ".join(parts)


def nri_visible(res: Resources) -> bool:
    """Whether `res` sets a field NRI can carry (an empty cpuset means "not set" in NRI, §8.3)."""
    return (
        res.cpu_shares is not None
        or res.cfs_quota is not None
        or bool(res.cpuset)
        or (res.memory_limit is not None)
    )


def differing(want: Resources, have: Resources | None) -> Resources:
    """The fields of `want` that are set and differ from `have` (the empty cpuset is never sent)."""
    have = have or Resources()
    out = Resources()
    if want.cpu_shares is not None and want.cpu_shares != have.cpu_shares:
        out.cpu_shares = want.cpu_shares
    if want.cfs_quota is not None and want.cfs_quota != (
        have.cfs_quota if have.cfs_quota is not None else -1
    ):
        out.cfs_quota = want.cfs_quota
    if want.cpuset and want.cpuset != have.cpuset:
        out.cpuset = want.cpuset
    if want.memory_limit is not None and want.memory_limit != (
        have.memory_limit if have.memory_limit is not None else -1
    ):
        out.memory_limit = want.memory_limit
    return out


def fill_resources(target: api.LinuxResources, res: Resources) -> None:
    """Copy the set origin fields into NRI LinuxResources (an empty cpuset means "not set" in NRI)."""
    if res.cpu_shares is not None:
        target.cpu.shares.value = res.cpu_shares
    if res.cfs_quota is not None:
        target.cpu.quota.value = res.cfs_quota
    if res.cpuset:
        target.cpu.cpus = res.cpuset
    if res.memory_limit is not None:
        target.memory.limit.value = res.memory_limit


def fill_adjustment(adjust: api.ContainerAdjustment, ctx: ContainerContext) -> None:
    """koordlet NriDone for CreateContainer: resources, env and (extension) oom_score_adj."""
    resp = ctx.response
    if nri_visible(resp.resources):
        fill_resources(adjust.linux.resources, resp.resources)
    for key, value in resp.add_envs.items():
        adjust.env.add(key=key, value=value)
    if resp.oom_score_adj is not None:
        adjust.linux.oom_score_adj.value = resp.oom_score_adj
