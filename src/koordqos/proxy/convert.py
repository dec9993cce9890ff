"""RuntimeHookService messages ↔ hook contexts (docs/behaviour-runtime-hooks.md, "Pod and container contexts",
"Proxy mode"). Pure: no I/O.

* `ProxyConverter.pod_context` / `.container_context` are koordlet's `FromProxy`: the same `PodContext` /
  `ContainerContext` the NRI conversion builds, so the same hooks run on the same inputs. The pod's batch
  resources come from its spec when the pod is known from the API server, else from the
  extended-resource-spec annotation (as on the NRI path).
* `pod_response` / `container_response` are koordlet's `ProxyDone` merge: the response is pre-filled from
  the request, then the origin fields the hooks set (cpuset, shares, quota, memory) overwrite it. An
  empty cpuset is propagated (docs/behaviour-runtime-hooks.md, "Project decisions": it replaces the kubelet's
  cpuset); container envs are merged.

A request the hooks cannot safely use (no pod UID, a cgroup parent or container id that would leave the
cgroup root) raises `ProxyRequestError`, which the service answers with INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from koordqos import observability as obs
from koordqos.cgroups.layout import CgroupLayout
from koordqos.errors import CgroupError, ProtocolError
from koordqos.hooks.context import (
    ContainerContext,
    ContainerRequest,
    PodContext,
    PodRequest,
    extended_for,
    runtime_container_id,
)
from koordqos.hooks.resources import ExtendedResourceSpec, ExtendedResourceSpecError, Resources
from koordqos.once import SeenOnce
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.proxy")


class ProxyRequestError(ProtocolError):
    """A hook request that is well-formed protobuf but unusable (answered with INVALID_ARGUMENT)."""


def resources_from_cri(res: rpb.LinuxContainerResources | None) -> Resources | None:
    """koordlet FromLinuxContainerResources: 0 / "" mean not specified; a negative memory limit is -1."""
    if res is None:
        return None
    out = Resources()
    if res.cpu_shares != 0:
        out.cpu_shares = res.cpu_shares
    if res.cpu_quota != 0:
        out.cfs_quota = res.cpu_quota
    if res.memory_limit_in_bytes != 0:
        out.memory_limit = res.memory_limit_in_bytes if res.memory_limit_in_bytes > 0 else -1
    if res.cpuset_cpus:
        out.cpuset = res.cpuset_cpus
    return out


def merge_resources(target: rpb.LinuxContainerResources, res: Resources) -> None:
    """Copy the origin fields the hooks set into CRI resources (an empty cpuset is copied too)."""
    if res.cpuset is not None:
        target.cpuset_cpus = res.cpuset
    if res.cfs_quota is not None:
        target.cpu_quota = res.cfs_quota
    if res.cpu_shares is not None:
        target.cpu_shares = res.cpu_shares
    if res.memory_limit is not None:
        target.memory_limit_in_bytes = res.memory_limit


def pod_response(req: rpb.PodSandboxHookRequest, ctx: PodContext | None) -> rpb.PodSandboxHookResponse:
    """The reply: the request's labels, annotations, cgroup parent and resources, then the hooks' values."""
    resp = rpb.PodSandboxHookResponse(cgroup_parent=req.cgroup_parent)
    resp.labels.update(req.labels)
    resp.annotations.update(req.annotations)
    if req.HasField("resources"):
        resp.resources.CopyFrom(req.resources)
    if ctx is not None and ctx.response.resources.is_origin_set():
        merge_resources(resp.resources, ctx.response.resources)
    return resp


def container_response(
    req: rpb.ContainerResourceHookRequest, ctx: ContainerContext | None
) -> rpb.ContainerResourceHookResponse:
    """The reply: the request's annotations, resources, pod cgroup parent and envs, then the hooks' values."""
    resp = rpb.ContainerResourceHookResponse(pod_cgroup_parent=req.pod_cgroup_parent)
    resp.container_annotations.update(req.container_annotations)
    resp.container_envs.update(req.container_envs)
    if req.HasField("container_resources"):
        resp.container_resources.CopyFrom(req.container_resources)
    if ctx is None:
        return resp
    if ctx.response.resources.is_origin_set():
        merge_resources(resp.container_resources, ctx.response.resources)
    resp.container_envs.update(ctx.response.add_envs)
    return resp


class ProxyConverter:
    """Builds hook contexts from RuntimeHookService requests (koordlet `FromProxy`)."""

    def __init__(self, layout: CgroupLayout, default_runtime: str = "containerd") -> None:
        self.layout = layout
        self.default_runtime = default_runtime
        self._warned: SeenOnce[str] = SeenOnce(4096)

    def _pod_dir(self, cgroup_parent: str, what: str) -> str:
        if not cgroup_parent:
            return ""
        try:
            return self.layout.normalize_parent(cgroup_parent)
        except CgroupError as exc:
            raise ProxyRequestError(f"{what}: cgroup parent {cgroup_parent!r} refused: {exc}") from None

    def _extended(
        self, uid: str, annotations: Mapping[str, str], state: NodeState, what: str
    ) -> ExtendedResourceSpec | None:
        try:
            return extended_for(uid, annotations, state.pods)
        except ExtendedResourceSpecError as exc:
            # as koordlet: the batch values stay unset, the request is still served
            obs.ERRORS.labels("proxy", "extended_resource_spec").inc()
            if self._warned.first(f"{what}:{exc}"):
                log.warning("proxy request annotation not usable by the hooks", target=what, error=str(exc))
            return None

    @staticmethod
    def _pod_meta(meta: rpb.PodSandboxMetadata, has: bool, method: str) -> str:
        if not has or not meta.uid:
            raise ProxyRequestError(f"{method}: pod_meta.uid is required")
        return f"{meta.namespace}/{meta.name}"

    def pod_context(self, req: rpb.PodSandboxHookRequest, state: NodeState, method: str = "") -> PodContext:
        """PodContext from a PodSandboxHookRequest (ProxyRequestError when unusable)."""
        meta = req.pod_meta
        what = self._pod_meta(meta, req.HasField("pod_meta"), method)
        labels = dict(req.labels)
        annotations = dict(req.annotations)
        return PodContext(
            PodRequest(
                uid=meta.uid,
                namespace=meta.namespace,
                name=meta.name,
                labels=labels,
                annotations=annotations,
                cgroup_parent=self._pod_dir(req.cgroup_parent, what),
                extended=self._extended(meta.uid, annotations, state, what),
            ),
            source="proxy",
        )

    def container_context(
        self, req: rpb.ContainerResourceHookRequest, state: NodeState, method: str = ""
    ) -> ContainerContext:
        """ContainerContext from a ContainerResourceHookRequest (ProxyRequestError when unusable)."""
        meta = req.pod_meta
        what = self._pod_meta(meta, req.HasField("pod_meta"), method)
        name = req.container_meta.name
        annotations = dict(req.pod_annotations)
        # PreCreateContainer comes before the runtime assigned an id: the container dir is then unknown
        raw_id = req.container_meta.id
        container_id = runtime_container_id(annotations, raw_id, self.default_runtime) if raw_id else ""
        pod_dir = self._pod_dir(req.pod_cgroup_parent, what)
        cdir = ""
        if pod_dir and container_id:
            try:
                cdir = self.layout.container_dir_in(pod_dir, container_id)
            except CgroupError as exc:
                raise ProxyRequestError(
                    f"{what}/{name}: container id {req.container_meta.id!r} refused: {exc}"
                ) from None
        ext = self._extended(meta.uid, annotations, state, what)
        return ContainerContext(
            ContainerRequest(
                pod_uid=meta.uid,
                container_name=name,
                container_id=container_id,
                pod_namespace=meta.namespace,
                pod_name=meta.name,
                pod_labels=dict(req.pod_labels),
                pod_annotations=annotations,
                pod_cgroup_parent=pod_dir,
                cgroup_parent=cdir,
                envs=dict(req.container_envs),
                resources=(
                    resources_from_cri(req.container_resources)
                    if req.HasField("container_resources")
                    else None
                ),
                extended=ext.containers.get(name) if ext is not None else None,
            ),
            source="proxy",
        )
