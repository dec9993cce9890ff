"""NRI: the plugin that serves runtime hooks to containerd / CRI-O (ttrpc, mux, session, lifecycle,
reconnect) and the adapter between NRI calls and the hook core (`convert.py`).

`build_plugin` creates the `NRIPlugin` component: `await plugin.update_containers([...])` sends unsolicited
updates; the connection state is in `status["nri"]` (shown by /readyz).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from koordqos.bus import EventBus
    from koordqos.config import AgentConfig
    from koordqos.decisions import DecisionLog
    from koordqos.nri.plugin import NRIPlugin
    from koordqos.nri.session import NRIHandler


def build_plugin(
    bus: EventBus,
    config: AgentConfig,
    handler: NRIHandler,
    status: MutableMapping[str, Any],
    decisions: DecisionLog | None = None,
) -> NRIPlugin:
    """The NRI plugin (NRI_PLUGIN_* from the environment when the runtime launched us); its busy-poll gate
    reads the node's CPU from the proc root."""
    from koordqos.nri.busypoll import SpareCPU, spare_cpu
    from koordqos.nri.plugin import DEFAULT_EVENTS, NRIPlugin, mask_without_stages

    gate = None
    if config.nri.busy_poll_seconds > 0:
        gate = SpareCPU(config.paths.proc_root / "stat", fallback=lambda: spare_cpu(bus.state))
    return NRIPlugin.from_env(
        bus,
        config.nri,
        handler=handler,
        failure_policy=config.hooks.failure_policy,
        status=status,
        events_mask=mask_without_stages(DEFAULT_EVENTS, config.hooks.disable_stages),
        busy_poll_gate=gate,
        decisions=decisions,
    )
