"""NodeSLO: the spec fields the strategies and hooks use, merged with koordlet's defaults."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class NodeSLO(BaseModel):
    """Placeholder, replaced by the Kubernetes integration work."""

    model_config = ConfigDict(extra="allow", frozen=True)


def parse_nodeslo(doc: dict[str, object]) -> NodeSLO:
    """Validate a NodeSLO document (placeholder until the NodeSLO model lands)."""
    return NodeSLO.model_validate(doc.get("spec", doc))
