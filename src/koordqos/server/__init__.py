"""HTTP endpoints: /healthz, /readyz, /metrics and (with --debug-endpoints) /debug/*."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component


def setup(ctx: AgentContext) -> list[Component]:
    """Serve the agent's HTTP endpoints."""
    from koordqos.server.http import HTTPServer

    server = HTTPServer(ctx)
    ctx.services["http"] = server
    return [server]
