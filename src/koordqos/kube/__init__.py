"""Kubernetes integration: reflector, evictor, event recorder, report writers (local mode lives outside, in
`koordqos.localsources`).

Builders for the composer (`agent.py`): `KubeConnection` (one lazily loaded client), `cluster_sources` (the
`kube-pods`, `kube-node` and `kube-nodeslo` reflectors); local mode uses `koordqos.localsources.LocalSources`.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from koordqos.kube.client import KubeClient, load_client_config
from koordqos.kube.kubeconfig import KubeSource

if TYPE_CHECKING:
    from koordqos.bus import EventBus
    from koordqos.config import AgentConfig
    from koordqos.kube.eventrecorder import EventRecorder
    from koordqos.kube.reflector import Reflector
    from koordqos.kube.sources import NodeSLOSource


class KubeConnection:
    """Loads the kubeconfig (or in-cluster config) once and shares one KubeClient.

    The agent loads it before its components start (a failure is a start-up error); other users load it on
    first use. `source` (`kube.kubeconfig.find_source`) names it in errors."""

    def __init__(
        self, kubeconfig: str | None, in_cluster: bool | None = None, source: KubeSource | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.in_cluster = (
            in_cluster
            if in_cluster is not None
            else not kubeconfig
            and not os.environ.get("KUBECONFIG")
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        )
        self.source = source
        self._client: KubeClient | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def of(cls, source: KubeSource) -> KubeConnection:
        """The connection to what `source` names."""
        return cls(source.kubeconfig, in_cluster=source.in_cluster, source=source)

    async def get(self) -> KubeClient:
        """The shared client (KubeError when the configuration cannot be loaded)."""
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    where = self.source.describe() if self.source is not None else None
                    cfg = await load_client_config(self.kubeconfig, self.in_cluster, where)
                    self._client = KubeClient(cfg)
        return self._client

    async def close(self) -> None:
        """Close the client's connections."""
        if self._client is not None:
            await self._client.close()


def cluster_sources(
    bus: EventBus, conn: KubeConnection, recorder: EventRecorder, config: AgentConfig
) -> tuple[list[Reflector], NodeSLOSource]:
    """The reflectors of the node's pods, Node and NodeSLO (field selectors on the node name)."""
    from koordqos.kube.reflector import Reflector, ReflectorSettings
    from koordqos.kube.sources import (
        NODES_PATH,
        NODESLOS_PATH,
        PODS_PATH,
        NodeSLOSource,
        NodeSource,
        PodSource,
    )

    cfg = config.kube
    settings = ReflectorSettings(
        resync_seconds=cfg.resync_seconds,
        watch_timeout_seconds=cfg.watch_timeout_seconds,
        read_timeout_seconds=cfg.read_timeout_seconds,
    )
    node = config.node_name
    nodeslo = NodeSLOSource(bus, node, recorder)
    reflectors = [
        Reflector("pods", conn.get, PODS_PATH, PodSource(bus, node), f"spec.nodeName={node}", settings),
        Reflector("node", conn.get, NODES_PATH, NodeSource(bus, node), f"metadata.name={node}", settings),
        Reflector("nodeslo", conn.get, NODESLOS_PATH, nodeslo, f"metadata.name={node}", settings),
    ]
    if config.gate("BlkIOReconcile"):  # blkio pod volumes that are claims (kube/pvc.py)
        from koordqos.kube.pvc import PVCS_PATH, VolumeClaimSource

        reflectors.append(Reflector("pvcs", conn.get, PVCS_PATH, VolumeClaimSource(bus), "", settings))
    return reflectors, nodeslo
