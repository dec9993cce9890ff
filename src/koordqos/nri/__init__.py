"""NRI: the plugin that serves runtime hooks to containerd / CRI-O (ttrpc, mux, session, lifecycle,
reconnect) and the adapter between NRI calls and the hook core (`convert.py`).

`build_plugin` creates the `NRIPlugin` component: `await plugin.update_containers([...])` sends unsolicited
updates; the connection state is in `status["nri"]` (shown by /readyz).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from koordqos.config import AgentConfig
    from koordqos.events.bus import EventBus
    from koordqos.nri.plugin import NRIPlugin
    from koordqos.nri.session import NRIHandler


def build_plugin(
    bus: EventBus, config: AgentConfig, handler: NRIHandler, status: MutableMapping[str, Any]
) -> NRIPlugin:
    """The NRI plugin (NRI_PLUGIN_* from the environment when the runtime launched us)."""
    from koordqos.nri.plugin import DEFAULT_EVENTS, NRIPlugin, mask_without_stages

    return NRIPlugin.from_env(
        bus,
        config.nri,
        handler=handler,
        failure_policy=config.hooks.failure_policy,
        status=status,
        events_mask=mask_without_stages(DEFAULT_EVENTS, config.hooks.disable_stages),
    )
