"""NRI calls ↔ hook contexts (docs/behaviour-nri.md, "Events and answers"): the NRI adapter of the hook
core.

The plugin hands every NRI call (a `koordqos.nri.calls` record) to `NRIHooks`, inside the hook core's
`run_call` (deadline, failure policy); this module only translates:

* RunPodSandbox → PreRunPodSandbox on a PodContext; the core writes the pod-level values (bvt, idle, shares,
  quota, memory) to the pod cgroup before the reply.
* CreateContainer → PreCreateContainer; the result goes into the `ContainerAdjustment` (cpu shares,
  quota, cpuset, memory limit, env, oom_score_adj).
* UpdateContainer → PreUpdateContainerResources on the resources the runtime is about to apply
  (falling back to the container's current ones); a `ContainerUpdate` naming the container, only when a
  resource field was set (docs/behaviour-nri.md, "Events and answers").
* Synchronize → for every CREATED/RUNNING/PAUSED container, PreUpdateContainerResources on its current
  resources; an update for each container whose values differ (docs/behaviour-nri.md, "Events and answers").
* RemovePodSandbox → drop the executor's cached values for the pod's cgroups.

Pods known from the API server contribute their spec (batch resources); pods seen only through NRI use
their annotations, so both go through the same hooks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.layout import CgroupLayout
from koordqos.errors import CgroupError
from koordqos.hooks.context import (
    ContainerContext,
    ContainerRequest,
    PodContext,
    PodRequest,
    Stage,
    extended_for,
    runtime_of,
)
from koordqos.hooks.core import Call, HookCore
from koordqos.hooks.resources import ExtendedResourceSpec, ExtendedResourceSpecError, Resources
from koordqos.model.pod import PodInfo
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import (
    SYNC_SLICE_SECONDS,
    NRICall,
    NRICreateContainer,
    NRIRemovePodSandbox,
    NRIRunPodSandbox,
    NRISynchronize,
    NRIUpdateContainer,
)
from koordqos.once import ENTRY_OVERHEAD, BoundedMemo, SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.nri.convert")

DIR_MEMO_BYTES = 256 * 1024  # the cgroup-parent memo's budget (koordqos.once.BoundedMemo)
DIR_MEMO_ENTRY_BYTES = 4096  # a parent longer than this is checked every time, never memoised

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
    # no HasField checks: an unset message reads as its defaults (0, ""), which mean "not specified" too
    out = Resources()
    cpu = res.cpu
    shares = cpu.shares.value
    if shares:
        out.cpu_shares = int(shares)
    quota = cpu.quota.value
    if quota:
        out.cfs_quota = int(quota)
    cpus = cpu.cpus
    if cpus:
        out.cpuset = cpus
    limit = res.memory.limit.value
    if limit:
        out.memory_limit = int(limit) if limit > 0 else -1
    return out


def _copy_map(m: Any) -> dict[str, str]:
    """A protobuf map field as a dict: iterating the (C) map directly is ≈ 3× faster than `dict(m)`,
    which goes through the Python Mapping mixin's keys view."""
    return {k: m[k] for k in m}


def envs_from_nri(env: Any) -> dict[str, str]:
    """`KEY=VALUE` strings → dict; entries with an empty key or value are dropped (koordlet)."""
    out: dict[str, str] = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep and key and value:
            out[key] = value
    return out


# Pod views kept per distinct PodSandbox message: every container call of a pod repeats the pod (and its
# annotations, a few KB), so what follows from it alone is derived once. Kept per sandbox id and used only for
# the message's exact (deterministic) bytes, so a view can never be stale; a changed pod replaces its view
# (the replaced one stays weighed until the memo is emptied). Only pods up to POD_VIEW_MAX_BYTES are kept,
# and the views kept weigh at most POD_VIEW_BYTES (a view ~ 4x its message: the bytes, the label and
# annotation copies, the parsed spec), then they are all dropped at once (koordqos.once.BoundedMemo). A byte
# budget, not a count: every distinct message is a view, and a runtime sending distinct ones (the fuzz run)
# churned 256 views of any size through the heap (RSS +12 MiB over 400,000 requests, fragmentation; +1.5 MiB
# with this budget).
POD_VIEW_BYTES = 256 << 10
POD_VIEW_MAX_BYTES = 16 << 10
POD_VIEW_WEIGHT = 4  # bytes a view takes per byte of its message


@dataclass(slots=True, eq=False)
class PodView:
    """What hooks read from an NRI PodSandbox, converted once per distinct message."""

    uid: str
    namespace: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    pod_dir: str  # checked dir relative to the cgroup root, "" when missing or refused
    runtime: str  # prefix of the pod's container ids ("docker" when the pod says so)
    known: PodInfo | None  # the API server's pod when `extended` was derived (it is preferred)
    extended: ExtendedResourceSpec | None
    # (kind, target, error text) counted on every use; texts, not exceptions: an exception kept here would
    # hold, through its traceback, the frames that raised it and their NodeState (a reference cycle)
    problems: tuple[tuple[str, str, str], ...]


class NRIHooks:
    """The NRI adapter: each NRI call to hook contexts, through the core, into the reply."""

    def __init__(self, core: HookCore, layout: CgroupLayout, default_runtime: str = "containerd") -> None:
        self.core = core
        self.layout = layout
        self.default_runtime = default_runtime
        self._warned: SeenOnce[str] = SeenOnce()
        # runtime cgroup parent → checked relative dir, within a byte budget: the parents are the runtime's
        # text, of any length (a real one is ~100 bytes; ~700 of those fit)
        self._dirs: BoundedMemo[str, str] = BoundedMemo(DIR_MEMO_BYTES, DIR_MEMO_ENTRY_BYTES)
        # sandbox id → (its serialized PodSandbox, the view): found by the id and used when the bytes are
        # equal (a memcmp; hashing them as the key cost ≈ 3 instructions a byte, 12 K for a 3.5 KB pod)
        self._pod_views: BoundedMemo[str, tuple[bytes, PodView]] = BoundedMemo(
            POD_VIEW_BYTES, POD_VIEW_WEIGHT * POD_VIEW_MAX_BYTES + ENTRY_OVERHEAD
        )
        self._handlers: dict[type[Any], Callable[[Any, NodeState, Call], Awaitable[None] | None]] = {
            NRIRunPodSandbox: self.run_pod_sandbox,
            NRICreateContainer: self.create_container,
            NRIUpdateContainer: self.update_container,
            NRISynchronize: self.synchronize,
            NRIRemovePodSandbox: self.remove_pod_sandbox,
        }

    def __call__(self, event: NRICall, state: NodeState, call: Call) -> Awaitable[None] | None:
        """Serve one NRI call (the calls the hooks have nothing to do for return at once)."""
        handler = self._handlers.get(type(event))
        return None if handler is None else handler(event, state, call)

    def _normalize(self, parent: str) -> str:
        # memoised: every container of a pod repeats the pod's parent, and the path checks are not free
        rel = self._dirs.get(parent)
        if rel is None:
            rel = self.layout.normalize_parent(parent)
            self._dirs.put(parent, rel, len(parent) + len(rel))
        return rel

    # -- conversion -------------------------------------------------------------------------------

    def _bad(self, kind: str, what: str, error: str) -> None:
        CONVERT_ERRORS.labels(kind).inc()
        key = f"{kind}:{what}:{error}"
        if self._warned.first(key):
            log.warning("NRI data not usable by the hooks", kind=kind, target=what, error=error)

    def pod_view(self, pod: api.PodSandbox, state: NodeState) -> PodView:
        """The pod's view: from the cache when this exact PodSandbox was converted before (and the API
        server's pod it depends on is the same object), else converted now. Its problems (a refused
        cgroup parent, a malformed extended-resource-spec) are counted on every call, logged once."""
        # deterministic: map entries in key order, so the same pod gives the same bytes however its maps
        # were filled (a Go runtime marshals them in random order)
        raw = pod.SerializeToString(deterministic=True)
        hit = self._pod_views.get(pod.id)
        if hit is not None and hit[0] == raw and state.pods.get(hit[1].uid) is hit[1].known:
            view = hit[1]
        else:
            view = self._convert_pod(pod, state)
            self._pod_views.put(pod.id, (raw, view), POD_VIEW_WEIGHT * len(raw))
        for kind, what, error in view.problems:
            self._bad(kind, what, error)
        return view

    def _convert_pod(self, pod: api.PodSandbox, state: NodeState) -> PodView:
        problems: list[tuple[str, str, str]] = []
        what = f"{pod.namespace}/{pod.name}"
        annotations = _copy_map(pod.annotations)
        parent = pod.linux.cgroup_parent if pod.HasField("linux") else ""
        pod_dir = ""
        if parent:  # project decision: a missing pod.linux is an empty parent
            try:
                pod_dir = self._normalize(parent)
            except CgroupError as exc:
                problems.append(("cgroup_parent", what, str(exc)))
        extended: ExtendedResourceSpec | None = None
        try:
            extended = extended_for(pod.uid, annotations, state.pods)
        except ExtendedResourceSpecError as exc:
            problems.append(("extended_resource_spec", what, str(exc)))
        return PodView(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            labels=_copy_map(pod.labels),
            annotations=annotations,
            pod_dir=pod_dir,
            runtime=runtime_of(annotations, self.default_runtime),
            known=state.pods.get(pod.uid),
            extended=extended,
            problems=tuple(problems),
        )

    def pod_context(self, pod: api.PodSandbox, state: NodeState) -> PodContext:
        """PodContext.FromNri."""
        view = self.pod_view(pod, state)
        return PodContext(
            PodRequest(
                uid=view.uid,
                namespace=view.namespace,
                name=view.name,
                labels=view.labels,
                annotations=view.annotations,
                cgroup_parent=view.pod_dir,
                extended=view.extended,
            ),
            source="nri",
        )

    def container_context(
        self,
        pod: api.PodSandbox | PodView,
        ctr: api.Container,
        state: NodeState,
        resources: api.LinuxResources | None = None,
    ) -> ContainerContext:
        """ContainerContext.FromNri (`resources` overrides the container's own); `pod` may be its view."""
        view = pod if isinstance(pod, PodView) else self.pod_view(pod, state)
        container_id = f"{view.runtime}://{ctr.id}"
        pdir = view.pod_dir
        cdir = ""
        linux = ctr.linux
        name = ctr.name
        try:
            path = linux.cgroups_path
            if path:
                cdir = self._normalize(path)
            elif pdir:
                cdir = self.layout.container_dir_in(pdir, container_id)
        except CgroupError as exc:
            self._bad("cgroups_path", f"{view.namespace}/{view.name}/{name}", str(exc))
        if resources is None and linux.HasField("resources"):  # (an unset `linux` has no resources)
            resources = linux.resources
        ext = view.extended
        return ContainerContext(
            ContainerRequest(
                pod_uid=view.uid,
                container_name=name,
                container_id=container_id,
                pod_namespace=view.namespace,
                pod_name=view.name,
                pod_labels=view.labels,
                pod_annotations=view.annotations,
                pod_cgroup_parent=pdir,
                cgroup_parent=cdir,
                envs=envs_from_nri(ctr.env),
                resources=resources_from_nri(resources),
                extended=ext.containers.get(name) if ext is not None else None,
            ),
            source="nri",
        )

    def _record(
        self, ctx: ContainerContext, action: str, old: str, new: str, call: str, dry: bool | None = None
    ) -> bool:
        """Log the reply as a decision; False in dry-run (the runtime then gets nothing)."""
        r = ctx.request
        target = f"{r.pod_namespace}/{r.pod_name}/{r.container_name}"
        return self.core.record_reply(target, f"nri-{action}", new, call, dry, old=old)

    def _record_later(
        self,
        call: Call,
        ctx: ContainerContext,
        action: str,
        reason: str,
        ctr: api.Container | None = None,
    ) -> bool:
        """Record what the reply changes when the call settles (after the reply is written: the plugin
        settles it then; the comparison is bookkeeping, not the reply); False in dry-run, as read now."""
        dry = self.core.dry_run
        call.defer(self._record_changes, ctx, action, ctr, reason, dry)
        return not dry

    def _record_changes(
        self, ctx: ContainerContext, action: str, ctr: api.Container | None, call: str, dry: bool
    ) -> None:
        """A decision for the values the reply changes (against the container's own, or those the runtime is
        about to apply); none when the reply only repeats them."""
        resp = ctx.response
        have = ctx.request.resources
        diff = differing(resp.resources, have)
        oom = resp.oom_score_adj
        if oom is not None and ctr is not None and ctr.linux.HasField("oom_score_adj"):
            old_oom: int | None = ctr.linux.oom_score_adj.value
            if old_oom == oom:
                oom = None
        else:
            old_oom = None
        envs = tuple(k for k, v in resp.add_envs.items() if ctx.request.envs.get(k) != v)
        new = summary(diff, oom, envs, resp.rdt_class)
        extra = [f"mount={m.destination}" for m in resp.add_mounts]
        extra += [f"device={d.path}" for d in resp.add_devices]
        new = " ".join(filter(None, (new, *extra)))
        if new:
            self._record(ctx, action, _was(diff, have, old_oom if oom is not None else None), new, call, dry)

    # -- handlers ---------------------------------------------------------------------------------

    async def run_pod_sandbox(self, event: NRIRunPodSandbox, state: NodeState, call: Call) -> None:
        """Run the pod stage; the core writes the pod cgroups before the reply."""
        ctx = self.pod_context(event.pod, state)
        reason = f"RunPodSandbox {event.pod.namespace}/{event.pod.name}"
        await self.core.pod_stage(call, Stage.PRE_RUN_POD_SANDBOX, ctx, state, reason)

    def create_container(self, event: NRICreateContainer, state: NodeState, call: Call) -> None:
        """Run PreCreateContainer and fill the adjustment."""
        ctx = self.container_context(event.pod, event.container, state)
        self.core.stage(call, Stage.PRE_CREATE_CONTAINER, ctx, state)
        resp = ctx.response
        if not (
            nri_visible(resp.resources)
            or resp.add_envs
            or resp.oom_score_adj is not None
            or resp.rdt_class is not None
            or resp.add_mounts
            or resp.add_devices
        ):
            return
        if self._record_later(call, ctx, "adjust", "CreateContainer", event.container):
            fill_adjustment(event.adjust, ctx)

    def update_container(self, event: NRIUpdateContainer, state: NodeState, call: Call) -> None:
        """Run PreUpdateContainerResources on the requested resources; update this container if set."""
        requested = event.linux_resources if event.linux_resources.ByteSize() > 0 else None
        ctx = self.container_context(event.pod, event.container, state, requested)
        self.core.stage(call, Stage.PRE_UPDATE_CONTAINER_RESOURCES, ctx, state)
        res = ctx.response.resources
        if nri_visible(res) and self._record_later(call, ctx, "update", "UpdateContainer"):
            fill_resources(event.update_for(event.container.id).linux.resources, res)

    async def synchronize(self, event: NRISynchronize, state: NodeState, call: Call) -> None:
        """Correct every live container whose hook values differ from what it has; thousands of containers
        (≈ 50 µs each) are worked through in slices, yielding to the event loop between them."""
        # the rules and share pools of this state (the runtime's pods included): the reconciler plans the same
        # containers from the same computation, so it keeps what is answered here
        self.core.refresh(state)
        pods = {p.id: p for p in event.pods}
        views: dict[str, PodView] = {}
        clock = time.perf_counter
        until = clock() + SYNC_SLICE_SECONDS
        for i, ctr in enumerate(event.containers):
            if i % 4 == 3 and clock() > until:  # a container is ≈ 50 µs: little overrun
                await asyncio.sleep(0)
                until = clock() + SYNC_SLICE_SECONDS
            if call.timed_out:
                break  # past the deadline: send what was computed, the reconciler covers the rest
            if ctr.state not in _LIVE_STATES:
                continue
            pod = pods.get(ctr.pod_sandbox_id)
            if pod is None:
                continue
            view = views.get(pod.id)
            if view is None:
                view = views[pod.id] = self.pod_view(pod, state)
            ctx = self.container_context(view, ctr, state)
            self.core.stage(call, Stage.PRE_UPDATE_CONTAINER_RESOURCES, ctx, state)
            have = ctx.request.resources
            diff = differing(ctx.response.resources, have)
            if nri_visible(diff) and self._record(
                ctx, "update", _was(diff, have), summary(diff), "Synchronize"
            ):
                fill_resources(event.update_for(ctr.id).linux.resources, diff)

    def remove_pod_sandbox(self, event: NRIRemovePodSandbox, state: NodeState, call: Call) -> None:
        """Forget cached cgroup values of the removed pod."""
        self.core.forget_pod(self.pod_view(event.pod, state).pod_dir)


def summary(
    res: Resources, oom: int | None = None, envs: tuple[str, ...] = (), rdt_class: str | None = None
) -> str:
    """The values a reply sets, as a decision's `new` ("shares=1024 cpus=2-3"; env: the names added)."""
    parts = []
    if res.cpu_shares is not None:
        parts.append(f"shares={res.cpu_shares}")
    if res.cfs_quota is not None:
        parts.append(f"quota={res.cfs_quota}")
    if res.cpuset is not None:
        parts.append(f"cpus={res.cpuset}")
    if res.memory_limit is not None:
        parts.append(f"memory={res.memory_limit}")
    if oom is not None:
        parts.append(f"oom_score_adj={oom}")
    if envs:
        parts.append("env=" + ",".join(envs))
    if rdt_class is not None:
        parts.append(f"rdt_class={rdt_class}")
    return " ".join(parts)


def _was(diff: Resources, have: Resources | None, oom: int | None = None) -> str:
    """A decision's `old`: the container's values of the fields `diff` changes (unset quota and memory limit
    read -1, as `differing` compares them; an unset share or cpuset "unset")."""
    have = have or Resources()
    parts = []
    if diff.cpu_shares is not None:
        parts.append(f"shares={'unset' if have.cpu_shares is None else have.cpu_shares}")
    if diff.cfs_quota is not None:
        parts.append(f"quota={-1 if have.cfs_quota is None else have.cfs_quota}")
    if diff.cpuset is not None:
        parts.append(f"cpus={have.cpuset or 'unset'}")
    if diff.memory_limit is not None:
        parts.append(f"memory={-1 if have.memory_limit is None else have.memory_limit}")
    if oom is not None:
        parts.append(f"oom_score_adj={oom}")
    return " ".join(parts)


def nri_visible(res: Resources) -> bool:
    """Whether `res` sets a field NRI can carry (an empty cpuset means "not set" in NRI:
    docs/behaviour-runtime-hooks.md, "Project decisions")."""
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
    cpu = target.cpu  # read once (a by-name lookup in upb); it becomes set only when written to
    if res.cpu_shares is not None:
        cpu.shares.value = res.cpu_shares
    if res.cfs_quota is not None:
        cpu.quota.value = res.cfs_quota
    if res.cpuset:
        cpu.cpus = res.cpuset
    if res.memory_limit is not None:
        target.memory.limit.value = res.memory_limit


def fill_adjustment(adjust: api.ContainerAdjustment, ctx: ContainerContext) -> None:
    """koordlet NriDone for CreateContainer: resources, env, mounts, devices and (extension) oom_score_adj."""
    resp = ctx.response
    linux = adjust.linux  # read once (a by-name lookup in upb); it becomes set only when written to
    if nri_visible(resp.resources):
        fill_resources(linux.resources, resp.resources)
    for key, value in resp.add_envs.items():
        adjust.env.add(key=key, value=value)
    if resp.oom_score_adj is not None:
        linux.oom_score_adj.value = resp.oom_score_adj
    if resp.rdt_class is not None:
        linux.resources.rdt_class.value = resp.rdt_class
    for m in resp.add_mounts:
        adjust.mounts.add(destination=m.destination, type=m.type, source=m.source, options=list(m.options))
    for d in resp.add_devices:
        dev = linux.devices.add(path=d.path, type=d.type, major=d.major, minor=d.minor)
        dev.file_mode.value = d.file_mode
