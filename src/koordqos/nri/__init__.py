"""NRI: the plugin that serves runtime hooks to containerd / CRI-O (ttrpc, mux, lifecycle, reconnect).

`setup(ctx)` creates the `NRIPlugin` when `config.nri.enabled`: it goes on `ctx.services["nri_plugin"]`
(`await plugin.update_containers([...])` sends unsolicited updates) and runs as a component; the
connection state is in `ctx.status["nri"]` (shown by /readyz). Hooks attach to the request events in
`koordqos.nri.events`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component


def setup(ctx: AgentContext) -> list[Component]:
    """Create the NRI plugin component (or record that NRI is disabled)."""
    if not ctx.config.nri.enabled:
        ctx.status["nri"] = "disabled"
        return []
    from koordqos.nri.plugin import DEFAULT_EVENTS, NRIPlugin, mask_without_stages

    plugin = NRIPlugin.from_env(
        ctx.bus,
        ctx.config.nri,
        failure_policy=ctx.config.hooks.failure_policy,
        status=ctx.status,
        events_mask=mask_without_stages(DEFAULT_EVENTS, ctx.config.hooks.disable_stages),
    )
    ctx.services["nri_plugin"] = plugin
    return [plugin]
