"""Kubernetes integration: reflector, evictor, events, and the local (no-cluster) sources.

setup(ctx) puts on ctx.services:
* "evictor": `Evictor` (`await evict(pod, reason, message, strategy) -> bool`, `is_evicted(pod)`);
* cluster mode only: "kube_client" (`KubeConnection`, `await get()` → KubeClient), "event_recorder"
  (`EventRecorder`), "nodeslo_source" (`NodeSLOSource`);
* local mode: "local_sources" (`LocalSources`).
Components: cluster mode → reflectors `kube-pods`, `kube-node`, `kube-nodeslo`; local → `local-sources`.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from koordqos.kube.client import KubeClient, load_client_config

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component


class KubeConnection:
    """Lazily loads the kubeconfig (or in-cluster config) once and shares one KubeClient."""

    def __init__(self, kubeconfig: str | None, in_cluster: bool | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.in_cluster = (
            in_cluster
            if in_cluster is not None
            else not kubeconfig
            and not os.environ.get("KUBECONFIG")
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        )
        self._client: KubeClient | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> KubeClient:
        """The shared client (KubeError when the configuration cannot be loaded)."""
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    cfg = await load_client_config(self.kubeconfig, self.in_cluster)
                    self._client = KubeClient(cfg)
        return self._client

    async def close(self) -> None:
        """Close the client's connections."""
        if self._client is not None:
            await self._client.close()


def setup(ctx: AgentContext) -> list[Component]:
    """Cluster mode: watches + API evictor; local mode: procfs node, NodeSLO file or defaults, NRI pods."""
    from koordqos.kube.eventlimit import RateLimitedRecorder
    from koordqos.kube.evictor import Evictor
    from koordqos.kube.local import LocalSources
    from koordqos.kube.reflector import Reflector, ReflectorSettings
    from koordqos.kube.sources import (
        NODES_PATH,
        NODESLOS_PATH,
        PODS_PATH,
        NodeSLOSource,
        NodeSource,
        PodSource,
    )

    cfg = ctx.config
    if ctx.local_mode:
        local = LocalSources(ctx)
        ctx.services["local_sources"] = local
        ctx.services["evictor"] = Evictor(
            ctx.decisions, None, None, cfg.kube.eviction_qps, dry_run=cfg.dry_run
        )
        return [local]

    # kubernetes-asyncio's loaders take ~0.4 s to import: do it now, at build time, not as one long step on
    # the running loop when the first reflector connects
    import kubernetes_asyncio.config  # noqa: F401

    conn = KubeConnection(cfg.kube.kubeconfig)
    ctx.on_shutdown(conn.close)
    recorder = RateLimitedRecorder(conn.get, cfg.node_name)  # one Event per object and reason a minute
    ctx.services["kube_client"] = conn
    ctx.services["event_recorder"] = recorder
    ctx.services["evictor"] = Evictor(
        ctx.decisions, conn.get, recorder, cfg.kube.eviction_qps, dry_run=cfg.dry_run
    )
    settings = ReflectorSettings(
        resync_seconds=cfg.kube.resync_seconds,
        watch_timeout_seconds=cfg.kube.watch_timeout_seconds,
        read_timeout_seconds=cfg.kube.read_timeout_seconds,
    )
    node = cfg.node_name
    nodeslo = NodeSLOSource(ctx.bus, node, recorder)
    ctx.services["nodeslo_source"] = nodeslo
    return [
        Reflector("pods", conn.get, PODS_PATH, PodSource(ctx.bus, node), f"spec.nodeName={node}", settings),
        Reflector("node", conn.get, NODES_PATH, NodeSource(ctx.bus, node), f"metadata.name={node}", settings),
        Reflector("nodeslo", conn.get, NODESLOS_PATH, nodeslo, f"metadata.name={node}", settings),
    ]
