"""Pod views for the reconciler: one per pod, from the API server view and/or the runtime's sandboxes.

A pod known to the API server (PodInfo) and to NRI (sandbox, containers) yields one view with both; a pod
known only through NRI (local mode) yields a view without PodInfo. `pod_context` and `container_contexts`
turn a view into the same hook contexts NRI and the proxy build, so every pod goes through the same code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from koordqos.cgroups.layout import RUNTIME_SCOPE_PREFIX, CgroupLayout
from koordqos.events.types import RuntimeContainer, RuntimeSandbox
from koordqos.hooks.context import (
    ContainerContext,
    ContainerRequest,
    PodContext,
    PodRequest,
    container_context_from_pod,
    pod_context_from_pod,
)
from koordqos.hooks.resources import ExtendedResourceSpec, extended_from_annotation
from koordqos.model.keys import ANNOTATION_DOCKER_TYPE
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState

DEFAULT_RUNTIME = "containerd"
_RUNTIME_OF_SCOPE = {prefix: runtime for runtime, prefix in RUNTIME_SCOPE_PREFIX.items()}


@dataclass(frozen=True, slots=True)
class PodView:
    """What the node knows of one pod: its PodInfo and/or its sandbox, and its runtime containers."""

    uid: str
    pod: PodInfo | None
    sandbox: RuntimeSandbox | None
    containers: tuple[RuntimeContainer, ...]


CONTAINERS_PER_STEP = 256  # `group_containers` stops this often (~0.1–0.3 ms of grouping)

ContainersByPod = dict[str, list[RuntimeContainer]]


def group_containers(containers: Mapping[str, RuntimeContainer], into: ContainersByPod) -> Iterator[None]:
    """Group the runtime containers by pod uid into `into` (in the mapping's order), stopping after every
    CONTAINERS_PER_STEP containers so a caller can pace thousands of them."""
    for i, c in enumerate(containers.values(), 1):
        into.setdefault(c.pod_uid, []).append(c)
        if i % CONTAINERS_PER_STEP == 0:
            yield


def pod_views(state: NodeState, ctrs: ContainersByPod | None = None) -> Iterator[PodView]:
    """API-server pods first (with their sandbox if NRI knows it), then pods known only through NRI.

    `ctrs`: the state's containers already grouped (`group_containers`); grouped here when not given."""
    by_uid: dict[str, RuntimeSandbox] = {}
    for sb in state.sandboxes.values():
        by_uid[sb.uid] = sb
    if ctrs is None:
        ctrs = {}
        for _ in group_containers(state.containers, ctrs):
            pass
    for uid, pod in state.pods.items():
        yield PodView(uid, pod, by_uid.pop(uid, None), tuple(ctrs.get(uid, ())))
    for uid, sb in by_uid.items():
        yield PodView(uid, None, sb, tuple(ctrs.get(uid, ())))


def sandbox_runtime(
    pod: PodInfo | None, annotations: Mapping[str, str], containers: Sequence[RuntimeContainer]
) -> str:
    """Runtime for the sandbox id (docs/behaviour-runtime-hooks.md, "Pod and container contexts"): that of the
    pod's first container, else containerd.

    The first container status with a known `<runtime>://` prefix decides (containers, then init
    containers); for pods known only through NRI, a systemd cgroups path ("slice:<scope prefix>:id")
    or the docker annotation tells; containerd only when nothing does.
    """
    if pod is not None:
        for c in (*pod.containers, *pod.init_containers):
            if c.runtime in RUNTIME_SCOPE_PREFIX:
                return c.runtime
    for rc in containers:
        parts = rc.cgroups_path.split(":")
        if len(parts) == 3 and parts[1] in _RUNTIME_OF_SCOPE:
            return _RUNTIME_OF_SCOPE[parts[1]]
    if ANNOTATION_DOCKER_TYPE in annotations:
        return "docker"
    return DEFAULT_RUNTIME


def pod_context(view: PodView, layout: CgroupLayout) -> tuple[PodContext, str, ExtendedResourceSpec | None]:
    """The pod's context, its cgroup dir and its extended resources (CgroupError for a hostile uid)."""
    pod, sb = view.pod, view.sandbox
    if pod is not None:
        pod_dir = layout.pod_dir(pod)
        pctx = pod_context_from_pod(pod, pod_dir)
        return pctx, pod_dir, pctx.request.extended
    assert sb is not None
    pod_dir = layout.normalize_parent(sb.cgroup_parent) if sb.cgroup_parent else ""
    extended = extended_from_annotation(sb.annotations)
    pctx = PodContext(
        PodRequest(
            uid=sb.uid,
            namespace=sb.namespace,
            name=sb.name,
            labels=sb.labels,
            annotations=sb.annotations,
            cgroup_parent=pod_dir,
            extended=extended,
        )
    )
    return pctx, pod_dir, extended


def container_contexts(
    view: PodView, layout: CgroupLayout, pod_dir: str, extended: ExtendedResourceSpec | None
) -> Iterator[ContainerContext]:
    """Contexts of the pod's live containers: API-server containers, the sandbox, NRI-only containers."""
    pod, sb = view.pod, view.sandbox
    labels = pod.labels if pod is not None else sb.labels if sb is not None else {}
    annotations = pod.annotations if pod is not None else sb.annotations if sb is not None else {}
    seen: set[str] = set()
    runtime = sandbox_runtime(pod, annotations, view.containers)
    if pod is not None:
        for c in (*pod.init_containers, *pod.containers):
            if not c.container_id or c.state == "terminated":
                continue
            seen.add(c.runtime_id)
            cdir = layout.container_dir_in(pod_dir, c.container_id)
            yield container_context_from_pod(pod, c, pod_dir, cdir, extended)
    if sb is not None and sb.id and pod_dir:
        sandbox_id = f"{runtime}://{sb.id}"
        yield ContainerContext(
            ContainerRequest(
                pod_uid=view.uid,
                container_id=sandbox_id,
                sandbox=True,
                pod_namespace=sb.namespace,
                pod_name=sb.name,
                pod_labels=labels,
                pod_annotations=annotations,
                pod_cgroup_parent=pod_dir,
                cgroup_parent=layout.container_dir_in(pod_dir, sandbox_id),
            )
        )
    for rc in view.containers:
        if rc.id in seen or rc.state in ("stopped",):
            continue
        cdir = layout.normalize_parent(rc.cgroups_path) if rc.cgroups_path else ""
        ext = extended.containers.get(rc.name) if extended is not None else None
        yield ContainerContext(
            ContainerRequest(
                pod_uid=view.uid,
                container_name=rc.name,
                container_id=f"{runtime}://{rc.id}",
                pod_namespace=sb.namespace if sb is not None else "",
                pod_name=sb.name if sb is not None else "",
                pod_labels=labels,
                pod_annotations=annotations,
                pod_cgroup_parent=pod_dir,
                cgroup_parent=cdir,
                extended=ext,
            )
        )
