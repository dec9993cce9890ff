"""Local mode (no cluster): pods from NRI sandboxes, NodeSLO from a file (or defaults), node from procfs.

* Pods: every `RuntimeSandboxUpserted` on the bus becomes a `PodUpserted` (source "nri"; the sandbox labels
  and annotations carry the Koordinator QoS class, the cgroup parent the Kubernetes QoS class);
  `RuntimeSandboxRemoved` becomes `PodDeleted`.
* NodeSLO: `--nodeslo-file` (YAML or JSON, a NodeSLO object or a bare spec) polled for changes every
  `poll_seconds` (mtime/size/inode, cheap); invalid content keeps the last good NodeSLO; no file → defaults.
* Node: online CPUs (`cpuN` lines of ${PROC_ROOT}/stat) and MemTotal (${PROC_ROOT}/meminfo), re-read every
  minute.
* `SourceSynced` for pods, node and nodeslo right away.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import yaml

from koordqos import observability as obs
from koordqos.errors import ModelError
from koordqos.events.types import (
    NodeUpdated,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RuntimeSandbox,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
    SourceSynced,
)
from koordqos.kube.sources import NodeSLOSource
from koordqos.model.node import NodeInfo
from koordqos.model.pod import KubeQoS, PodInfo

if TYPE_CHECKING:
    from koordqos.agent import AgentContext
    from koordqos.state import NodeState

log = structlog.get_logger("koordqos.kube.local")

POD_UID_LABEL = "io.kubernetes.pod.uid"


def kube_qos_from_cgroup_parent(parent: str) -> KubeQoS:
    """The Kubernetes QoS class encoded in a pod cgroup parent (systemd or cgroupfs driver)."""
    low = parent.lower()
    if "besteffort" in low:
        return KubeQoS.BESTEFFORT
    if "burstable" in low:
        return KubeQoS.BURSTABLE
    return KubeQoS.GUARANTEED


def pod_from_sandbox(sandbox: RuntimeSandbox, node_name: str) -> PodInfo:
    """A PodInfo for an NRI pod sandbox (no container resources are known in local mode)."""
    uid = sandbox.uid or sandbox.labels.get(POD_UID_LABEL, "") or sandbox.id
    return PodInfo(
        uid=uid,
        namespace=sandbox.namespace,
        name=sandbox.name,
        node_name=node_name,
        labels=dict(sandbox.labels),
        annotations=dict(sandbox.annotations),
        phase="Running",
        kube_qos=kube_qos_from_cgroup_parent(sandbox.cgroup_parent),
        source="nri",
    )


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
    """Publishes pods from NRI sandboxes, the node from procfs and the NodeSLO file (or defaults)."""

    name = "local-sources"
    essential = False

    def __init__(
        self, ctx: AgentContext, poll_seconds: float = 1.0, node_refresh_seconds: float = 60.0
    ) -> None:
        self.ctx = ctx
        self.poll_seconds = poll_seconds
        self.node_refresh_seconds = node_refresh_seconds
        self.nodeslo = NodeSLOSource(ctx.bus, ctx.config.node_name, recorder=None, source="file")
        self._sandbox_uids: dict[str, str] = {}
        self._file_sig: tuple[int, int, int] | None = None
        self._node: NodeInfo | None = None
        ctx.bus.subscribe(
            "local-pods", self._on_sandbox, RuntimeSandboxUpserted, RuntimeSandboxRemoved, RuntimeSynchronized
        )

    async def _on_sandbox(self, event: Any, state: NodeState) -> None:
        bus = self.ctx.bus
        if isinstance(event, RuntimeSandboxUpserted):
            pod = pod_from_sandbox(event.sandbox, self.ctx.config.node_name)
            self._sandbox_uids[event.sandbox.id] = pod.uid
            await bus.publish(PodUpserted(pod))
        elif isinstance(event, RuntimeSandboxRemoved):
            uid = self._sandbox_uids.pop(event.id, None)
            if uid is not None:
                await bus.publish(PodDeleted(uid))
        elif isinstance(event, RuntimeSynchronized):
            # the runtime's full view: pods of sandboxes it no longer reports are gone, the rest upserted
            pods = [pod_from_sandbox(sb, self.ctx.config.node_name) for sb in event.sandboxes]
            self._sandbox_uids = {sb.id: pod.uid for sb, pod in zip(event.sandboxes, pods, strict=True)}
            await bus.publish(PodsReplaced(tuple(pods), source="nri"))

    async def run(self) -> None:
        """Publish node and NodeSLO, mark every source synced, then poll the file and procfs."""
        bus = self.ctx.bus
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
        node = read_node_from_procfs(self.ctx.config.paths.proc_root, self.ctx.config.node_name)
        if self._node is None or node.capacity != self._node.capacity:
            self._node = node
            await self.ctx.bus.publish(NodeUpdated(node))

    async def poll_nodeslo(self) -> None:
        """Apply the NodeSLO file when it changed (or the defaults when there is none)."""
        path = self.ctx.config.kube.nodeslo_file
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
