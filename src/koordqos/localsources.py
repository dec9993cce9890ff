"""Local mode (no cluster): pods from NRI sandboxes, NodeSLO from a file (or defaults), node from procfs.

* Pods: every `RuntimeSandboxUpserted` on the bus becomes a `PodUpserted` (source "nri"; the sandbox labels
  and annotations carry the Koordinator QoS class, the cgroup parent the Kubernetes QoS class);
  `RuntimeSandboxRemoved` becomes `PodDeleted`; `RuntimeSynchronized` becomes one `PodsReplaced`.
* Containers: the runtime's containers of a sandbox (NodeState.containers) become the pod's `containers`
  (`ContainerInfo` with id `<runtime>://<id>`, state, requests/limits from the Linux resources the runtime
  holds), so local pods are measured and handled per container like API pods. Container changes
  (`RuntimeContainerUpserted` / `RuntimeContainerRemoved`) mark the pod dirty; dirty pods are rebuilt and
  republished once per `coalesce_seconds` (a starting pod sends ~3 events per container) and only when
  their containers changed.
* NodeSLO: `--nodeslo-file` (YAML or JSON, a NodeSLO object or a bare spec) polled for changes every
  `poll_seconds` (mtime/size/inode, cheap); invalid content keeps the last good NodeSLO; no file → defaults.
* Node: online CPUs (`cpuN` lines of ${PROC_ROOT}/stat) and MemTotal (${PROC_ROOT}/meminfo), re-read every
  minute.
* `SourceSynced` for pods, node and nodeslo right away.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import yaml
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.layout import RUNTIME_SCOPE_PREFIX, CgroupLayout, kube_qos_of_parent
from koordqos.errors import CgroupError, ModelError
from koordqos.events.types import (
    NodeUpdated,
    NRIConnectionChanged,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RuntimeContainer,
    RuntimeContainerRemoved,
    RuntimeContainerUpserted,
    RuntimeSandbox,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
    SourceSynced,
)
from koordqos.kube.sources import NodeSLOSource
from koordqos.model.node import NodeInfo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.once import SeenOnce

if TYPE_CHECKING:
    from koordqos.bus import EventBus
    from koordqos.config import AgentConfig
    from koordqos.state import NodeState

log = structlog.get_logger("koordqos.localsources")

POD_UID_LABEL = "io.kubernetes.pod.uid"
MIN_SHARES = 2  # kubelet's cpu.shares for "no cpu request"
SLICE_SECONDS = 0.001  # the longest pod building runs between two yields (as nri.calls.SYNC_SLICE_SECONDS)

CGROUP_MISMATCH = Counter(
    "koordqos_local_cgroup_mismatch_total",
    "Local-mode pods or containers whose runtime cgroup differs from the dir the agent derives",
    ["level"],
    registry=obs.REGISTRY,
)

_RUNTIME_OF_SCOPE = {scope: runtime for runtime, scope in RUNTIME_SCOPE_PREFIX.items()}
# NRI container state → pod-status container state
_STATE = {"running": "running", "paused": "running", "created": "waiting", "stopped": "terminated"}
_STATE_RANK = {"running": 0, "waiting": 1, "": 2, "terminated": 3}


def kube_qos_from_cgroup_parent(parent: str) -> KubeQoS:
    """The Kubernetes QoS class encoded in a pod cgroup parent (systemd or cgroupfs driver)."""
    return kube_qos_of_parent(parent.lower())


def runtime_of_name(runtime_name: str) -> str:
    """The container-id prefix of an NRI runtime name ("containerd", "cri-o", …; containerd if unknown)."""
    low = runtime_name.lower()
    if "crio" in low or "cri-o" in low:
        return "cri-o"
    for runtime in ("docker", "pouch"):
        if runtime in low:
            return runtime
    return "containerd"


def runtime_of_container(ctr: RuntimeContainer, runtime_name: str = "") -> str:
    """The runtime of a container: the scope prefix of its cgroups path when it has one, else the name."""
    path = ctr.cgroups_path
    if path.count(":") == 2:  # systemd "kubepods-…slice:cri-containerd:<id>"
        found = _RUNTIME_OF_SCOPE.get(path.split(":")[1])
        if found is not None:
            return found
    leaf = path.rstrip("/").rpartition("/")[2]
    for scope, runtime in _RUNTIME_OF_SCOPE.items():
        if leaf.startswith(scope + "-"):  # "cri-containerd-<id>.scope", "crio-<id>"
            return runtime
    return runtime_of_name(runtime_name)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def container_resources(ctr: RuntimeContainer, kube_qos: KubeQoS) -> tuple[dict[str, int], dict[str, int]]:
    """(requests, limits) from the runtime's Linux resources, inverting kubelet's conversions.

    cpu request = shares × 1000 / 1024 (shares 2 = none), cpu limit = quota × 1000 / period, memory
    limit as is; Guaranteed pods request what they limit; BestEffort pods have neither (by definition, and
    their shares/quota are the agent's own batch adjustments).
    """
    if kube_qos is KubeQoS.BESTEFFORT:
        return {}, {}
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    if ctr.cpu_shares > MIN_SHARES:
        requests["cpu"] = _ceil_div(ctr.cpu_shares * 1000, 1024)
    if ctr.cpu_quota > 0 and ctr.cpu_period > 0:
        limits["cpu"] = _ceil_div(ctr.cpu_quota * 1000, ctr.cpu_period)
    if ctr.memory_limit > 0:
        limits["memory"] = ctr.memory_limit
    if kube_qos is KubeQoS.GUARANTEED:
        requests.update(limits)
    return requests, limits


def container_from_runtime(ctr: RuntimeContainer, kube_qos: KubeQoS, runtime_name: str = "") -> ContainerInfo:
    """A pod-status-like ContainerInfo for a runtime container."""
    requests, limits = container_resources(ctr, kube_qos)
    return ContainerInfo(
        name=ctr.name,
        container_id=f"{runtime_of_container(ctr, runtime_name)}://{ctr.id}",
        requests=requests,
        limits=limits,
        state=_STATE.get(ctr.state, ""),
    )


InfoOf = Callable[[RuntimeContainer, KubeQoS, str], ContainerInfo]


def _by_id(c: RuntimeContainer) -> str:
    return c.id


def pod_containers(
    containers: Iterable[RuntimeContainer],
    kube_qos: KubeQoS,
    runtime_name: str = "",
    info_of: InfoOf = container_from_runtime,
) -> tuple[ContainerInfo, ...]:
    """One ContainerInfo per container name, sorted by name; a restarted container's live instance wins
    over the stopped one (the pod status shows the current instance only)."""
    best: dict[str, ContainerInfo] = {}
    for ctr in sorted(containers, key=_by_id):
        info = info_of(ctr, kube_qos, runtime_name)
        old = best.get(info.name)
        if old is None or _STATE_RANK[info.state] < _STATE_RANK[old.state]:
            best[info.name] = info
    return tuple(best[name] for name in sorted(best))


def pod_from_sandbox(
    sandbox: RuntimeSandbox,
    node_name: str,
    containers: Iterable[RuntimeContainer] = (),
    runtime_name: str = "",
    info_of: InfoOf = container_from_runtime,
) -> PodInfo:
    """A PodInfo for an NRI pod sandbox and its runtime containers.

    The Kubernetes QoS class comes from the sandbox's cgroup parent (or, when the runtime gave none, from a
    container's cgroups path), so the pod's cgroup dir is the one the runtime uses.
    """
    ctrs = list(containers)
    uid = sandbox.uid or sandbox.labels.get(POD_UID_LABEL, "") or sandbox.id
    parent = sandbox.cgroup_parent or next((c.cgroups_path for c in ctrs if c.cgroups_path), "")
    kube_qos = kube_qos_from_cgroup_parent(parent)
    return PodInfo(
        uid=uid,
        namespace=sandbox.namespace,
        name=sandbox.name,
        node_name=node_name,
        labels=dict(sandbox.labels),
        annotations=dict(sandbox.annotations),
        phase="Running",
        kube_qos=kube_qos,
        containers=pod_containers(ctrs, kube_qos, runtime_name, info_of),
        source="nri",
    )


def containers_by_sandbox(
    containers: Iterable[RuntimeContainer], wanted: Iterable[str] | None = None
) -> dict[str, list[RuntimeContainer]]:
    """Group runtime containers by sandbox id (only the `wanted` sandboxes when given)."""
    keep = None if wanted is None else set(wanted)
    out: dict[str, list[RuntimeContainer]] = {}
    for c in containers:
        if keep is None or c.sandbox_id in keep:
            out.setdefault(c.sandbox_id, []).append(c)
    return out


def read_node_from_procfs(proc_root: Path, node_name: str) -> NodeInfo:
    """Node capacity from procfs: online CPUs (milli) and MemTotal (bytes)."""
    cpus = 0
    try:
        with open(proc_root / "stat", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("cpu") and line[3:4].isdigit():
                    cpus += 1
    except OSError as exc:
        log.warning("cannot read /proc/stat; using os.cpu_count()", error=str(exc))
    if cpus == 0:
        cpus = os.cpu_count() or 1
    mem = 0
    try:
        with open(proc_root / "meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError) as exc:
        log.warning("cannot read MemTotal from meminfo", error=str(exc))
    capacity = {"cpu": cpus * 1000, "memory": mem}
    return NodeInfo(name=node_name, capacity=capacity, allocatable=capacity, source="procfs")


def load_nodeslo_file(path: Path) -> dict[str, Any]:
    """Read a NodeSLO YAML/JSON file into a dict; ModelError naming the file when unreadable or not a map."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ModelError(f"{path}: invalid YAML/JSON: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: expected a mapping at the top level")
    return doc


class LocalSources:
    """Publishes pods from NRI sandboxes and containers, the node from procfs and the NodeSLO file."""

    name = "local-sources"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        config: AgentConfig,
        layout: CgroupLayout | None = None,
        poll_seconds: float = 1.0,
        node_refresh_seconds: float = 60.0,
        coalesce_seconds: float = 0.05,
    ) -> None:
        self.bus = bus
        self.config = config
        self.layout = layout
        self.poll_seconds = poll_seconds
        self.node_refresh_seconds = node_refresh_seconds
        self.coalesce_seconds = coalesce_seconds
        self.nodeslo = NodeSLOSource(bus, config.node_name, recorder=None, source="file")
        self._sandbox_uids: dict[str, str] = {}
        self._file_sig: tuple[int, int, int] | None = None
        self._node: NodeInfo | None = None
        self._runtime = ""  # NRI runtime name (container-id prefix when the cgroups path does not tell)
        self._ctr_sandbox: dict[str, str] = {}  # container id → sandbox id (removals carry only the id)
        self._sandbox_ctrs: dict[str, set[str]] = {}  # sandbox id → its container ids (the reverse)
        # container id → (the record, QoS, runtime name) its ContainerInfo was built from, and the info: a
        # republish rebuilds only the containers that changed, whatever the pod's container count
        self._infos: dict[str, tuple[RuntimeContainer, KubeQoS, str, ContainerInfo]] = {}
        self._built: list[RuntimeContainer] = []  # containers whose info the current `_pod` call built
        self._published: dict[str, tuple[KubeQoS, tuple[ContainerInfo, ...]]] = {}  # by sandbox id
        self._dirty: set[str] = set()  # sandbox ids whose containers changed since the last flush
        self._wake = asyncio.Event()
        self._warned: SeenOnce[str] = SeenOnce()
        self.republished = 0  # PodUpserted sent for container changes (observability, tests)
        bus.subscribe(
            "local-pods",
            self._on_runtime,
            RuntimeSandboxUpserted,
            RuntimeSandboxRemoved,
            RuntimeSynchronized,
            RuntimeContainerUpserted,
            RuntimeContainerRemoved,
            NRIConnectionChanged,
            immediate=self._container_changed,
        )

    def _info_of(self, ctr: RuntimeContainer, kube_qos: KubeQoS, runtime_name: str) -> ContainerInfo:
        hit = self._infos.get(ctr.id)
        if hit is not None and hit[0] is ctr and hit[1] is kube_qos and hit[2] == runtime_name:
            return hit[3]
        info = container_from_runtime(ctr, kube_qos, runtime_name)
        self._infos[ctr.id] = (ctr, kube_qos, runtime_name, info)
        self._built.append(ctr)
        return info

    def _pod(self, sandbox: RuntimeSandbox, containers: Iterable[RuntimeContainer]) -> PodInfo | None:
        """The sandbox's PodInfo; None when it would republish what was last published."""
        self._built = []
        pod = pod_from_sandbox(sandbox, self.config.node_name, containers, self._runtime, self._info_of)
        sig = (pod.kube_qos, pod.containers)
        if self._published.get(sandbox.id) == sig:
            return None
        self._published[sandbox.id] = sig
        # the pod's dir is checked on every rebuild (one path), a container's when its record changed
        self._check_dirs(pod, sandbox, self._built)
        return pod

    def _track(self, ctr_id: str, sandbox_id: str) -> None:
        old = self._ctr_sandbox.get(ctr_id)
        if old == sandbox_id:
            return
        if old is not None:
            self._sandbox_ctrs.get(old, set()).discard(ctr_id)
        self._ctr_sandbox[ctr_id] = sandbox_id
        self._sandbox_ctrs.setdefault(sandbox_id, set()).add(ctr_id)

    def _forget_container(self, ctr_id: str) -> str | None:
        sid = self._ctr_sandbox.pop(ctr_id, None)
        self._infos.pop(ctr_id, None)
        if sid is not None:
            ids = self._sandbox_ctrs.get(sid)
            if ids is not None:
                ids.discard(ctr_id)
                if not ids:
                    del self._sandbox_ctrs[sid]
        return sid

    def _container_changed(self, event: Any, state: NodeState) -> bool:
        """A container event: note its pod for the next flush (False for any other event). The bus calls
        it in the publisher's step when nothing is queued before the event, else from `_on_runtime`."""
        if isinstance(event, RuntimeContainerUpserted):
            ctr = event.container
            self._track(ctr.id, ctr.sandbox_id)
            self._mark(ctr.sandbox_id)
            return True
        if isinstance(event, RuntimeContainerRemoved):
            sid = self._forget_container(event.id)
            if sid is not None:
                self._mark(sid)
            return True
        return False

    async def _on_runtime(self, event: Any, state: NodeState) -> None:
        bus = self.bus
        if self._container_changed(event, state):
            return
        if isinstance(event, RuntimeSandboxUpserted):
            sb = event.sandbox
            self._published.pop(sb.id, None)  # labels and annotations may have changed: always publish
            pod = self._pod(sb, state.containers_of(sb.id).values())
            if pod is not None:
                self._sandbox_uids[sb.id] = pod.uid
                await bus.publish(PodUpserted(pod))
        elif isinstance(event, RuntimeSandboxRemoved):
            self._published.pop(event.id, None)
            self._dirty.discard(event.id)
            for cid in list(self._sandbox_ctrs.get(event.id, ())):
                self._forget_container(cid)
            uid = self._sandbox_uids.pop(event.id, None)
            if uid is not None:
                await bus.publish(PodDeleted(uid))
        elif isinstance(event, RuntimeSynchronized):
            # the runtime's full view: pods of sandboxes it no longer reports are gone, the rest upserted.
            # Thousands of containers: each phase in slices, and from a fresh step (a phase starting in the
            # step that ended the one before made steps of two slices)
            clock = asyncio.get_running_loop().time
            await asyncio.sleep(0)
            grouped = containers_by_sandbox(event.containers)  # one pass, ≈ 0.2 µs a container
            await asyncio.sleep(0)
            self._published = {}
            self._infos = {}
            pods: list[PodInfo] = []
            uids: dict[str, str] = {}
            until = clock() + SLICE_SECONDS
            for sb in event.sandboxes:
                if clock() > until:
                    await asyncio.sleep(0)  # ~10 µs per container: thousands are not one loop step
                    until = clock() + SLICE_SECONDS
                pod = self._pod(sb, grouped.get(sb.id, ()))
                if pod is not None:  # None only for a repeated sandbox
                    pods.append(pod)
                    uids[sb.id] = pod.uid
            self._sandbox_uids = uids
            self._ctr_sandbox = {}
            self._sandbox_ctrs = {}
            await asyncio.sleep(0)
            until = clock() + SLICE_SECONDS
            for i, c in enumerate(event.containers):
                if i % 64 == 63 and clock() > until:
                    await asyncio.sleep(0)
                    until = clock() + SLICE_SECONDS
                self._track(c.id, c.sandbox_id)
            self._dirty.clear()
            await asyncio.sleep(0)
            await bus.publish(PodsReplaced(tuple(pods), source="nri"))
        elif isinstance(event, NRIConnectionChanged) and event.connected and event.runtime:
            self._runtime = event.runtime

    def _mark(self, sandbox_id: str) -> None:
        self._dirty.add(sandbox_id)
        self._wake.set()

    async def flush(self) -> int:
        """Republish the pods whose containers changed (from the newest NodeState); returns how many."""
        dirty, self._dirty = self._dirty, set()
        if not dirty:
            return 0
        state = self.bus.state
        sent = 0
        clock = asyncio.get_running_loop().time
        until = clock() + SLICE_SECONDS
        for sid in sorted(dirty):
            if clock() > until:
                await asyncio.sleep(0)
                state = self.bus.state
                until = clock() + SLICE_SECONDS
            sb = state.sandboxes.get(sid)
            if sb is None or sid not in self._sandbox_uids:
                continue  # removed meanwhile, or its upsert is still queued (it will carry the containers)
            pod = self._pod(sb, state.containers_of(sid).values())
            if pod is None:
                continue  # no change (e.g. a start that only repeated the state)
            await self.bus.publish(PodUpserted(pod))
            sent += 1
        self.republished += sent
        return sent

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            # gather the rest of the burst: a starting container sends create, start and post-start
            await asyncio.sleep(self.coalesce_seconds)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # a bad container record must not stop republishing
                obs.ERRORS.labels("local-sources", type(exc).__name__).inc()
                log.error("cannot republish local pods", error=f"{type(exc).__name__}: {exc}")

    def _check_dirs(self, pod: PodInfo, sandbox: RuntimeSandbox, ctrs: list[RuntimeContainer]) -> None:
        """Warn once (and count) when the runtime's cgroups are not where the agent will look for them
        (the pod's dir and the dirs of `ctrs`)."""
        layout = self.layout
        if layout is None:
            return
        try:
            pod_dir = layout.pod_dir(pod)
        except CgroupError as exc:
            self._mismatch(
                "pod", sandbox.id, "local pod has no usable cgroup dir", pod=pod.key, error=str(exc)
            )
            return
        if sandbox.cgroup_parent:
            self._compare(layout, "pod", sandbox.id, pod_dir, sandbox.cgroup_parent, pod=pod.key)
        ids = {c.runtime_id: c.container_id for c in pod.containers}
        for ctr in ctrs:
            cid = ids.get(ctr.id)
            if not ctr.cgroups_path or cid is None:
                continue
            try:
                derived = layout.container_dir_in(pod_dir, cid)
            except CgroupError as exc:
                self._mismatch("container", ctr.id, "local container not measurable", error=str(exc))
                continue
            self._compare(layout, "container", ctr.id, derived, ctr.cgroups_path, pod=pod.key)

    def _compare(
        self, layout: CgroupLayout, level: str, key: str, derived: str, reported: str, **kw: str
    ) -> None:
        try:
            actual = layout.normalize_parent(reported)
        except CgroupError as exc:
            self._mismatch(level, key, "runtime cgroup path refused", path=reported, error=str(exc), **kw)
            return
        if actual != derived:
            self._mismatch(
                level,
                key,
                "runtime cgroup differs from the derived dir",
                runtime=actual,
                derived=derived,
                **kw,
            )

    def _mismatch(self, level: str, key: str, msg: str, **kw: str) -> None:
        CGROUP_MISMATCH.labels(level).inc()
        if self._warned.first(key):
            log.warning(msg, level=level, id=key, **kw)

    async def run(self) -> None:
        """Publish node and NodeSLO, mark every source synced, then poll the file and procfs (and
        republish pods whose containers changed)."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._flush_loop(), name="local-pods-flush")
            await self._poll()

    async def _poll(self) -> None:
        bus = self.bus
        await self.refresh_node()
        await self.poll_nodeslo()
        for source in ("node", "pods"):
            await bus.publish(SourceSynced(source))
        loop = asyncio.get_running_loop()
        next_node = loop.time() + self.node_refresh_seconds
        while True:
            await asyncio.sleep(self.poll_seconds)
            await self.poll_nodeslo()
            if loop.time() >= next_node:
                next_node = loop.time() + self.node_refresh_seconds
                await self.refresh_node()

    async def refresh_node(self) -> None:
        """Re-read procfs; publish NodeUpdated when capacity changed."""
        node = read_node_from_procfs(self.config.paths.proc_root, self.config.node_name)
        if self._node is None or node.capacity != self._node.capacity:
            self._node = node
            await self.bus.publish(NodeUpdated(node))

    async def poll_nodeslo(self) -> None:
        """Apply the NodeSLO file when it changed (or the defaults when there is none)."""
        path = self.config.kube.nodeslo_file
        if path is None:
            if self._file_sig is None:
                self._file_sig = (0, 0, 0)
                await self.nodeslo.apply_default("no --nodeslo-file")
            return
        try:
            st = os.stat(path)
            sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            sig = (-1, -1, -1)
        if sig == self._file_sig:
            return
        self._file_sig = sig
        if sig[0] == -1:
            log.warning("NodeSLO file missing; using defaults (or the last good)", path=str(path))
            if self.nodeslo.current is None:
                await self.nodeslo.apply_default("NodeSLO file missing")
            return
        try:
            doc = load_nodeslo_file(path)
        except ModelError as exc:
            obs.ERRORS.labels("nodeslo-file", "read").inc()
            log.error("cannot read NodeSLO file; keeping the last good", path=str(path), error=str(exc))
            if self.nodeslo.current is None:
                await self.nodeslo.apply_default("NodeSLO file unreadable")
            return
        log.info("NodeSLO file changed", path=str(path))
        await self.nodeslo.apply(doc)
