"""Kubernetes integration: reflector, evictor, events, and the local (no-cluster) sources."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component


def setup(ctx: AgentContext) -> list[Component]:
    """Cluster mode: watches; local mode: procfs node, NodeSLO file or defaults, pods from NRI."""
    from koordqos.kube.local import LocalSources

    if ctx.local_mode:
        return [LocalSources(ctx)]
    return []
