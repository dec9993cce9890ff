"""LocalSources: node from procfs and defaults for NodeSLO when no cluster is configured."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from koordqos.events.types import NodeSLOUpdated, NodeUpdated, SourceSynced
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import NodeInfo

if TYPE_CHECKING:
    from koordqos.agent import AgentContext


class LocalSources:
    """Publishes the node (capacity from procfs), the default NodeSLO and marks every source synced."""

    name = "local-sources"
    essential = False

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx

    async def run(self) -> None:
        """Publish once, then idle."""
        bus = self.ctx.bus
        cpus = os.cpu_count() or 1
        node = NodeInfo(name=self.ctx.config.node_name, capacity={"cpu": cpus * 1000},
                        allocatable={"cpu": cpus * 1000})
        await bus.publish(NodeUpdated(node))
        await bus.publish(NodeSLOUpdated(NodeSLO()))
        for source in ("node", "nodeslo", "pods"):
            await bus.publish(SourceSynced(source))
        await asyncio.Event().wait()
