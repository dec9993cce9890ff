"""Proxy mode: the RuntimeHookService koord-runtime-proxy calls around each CRI call (grpclib, unix socket).

`build_server` (when `--enable-runtime-hooks-proxy`) returns the `ProxyServer` component serving
`--runtime-hooks-addr` and keeping `<--runtime-hooks-config-path>/koordlet.json` current; every call runs
through the hook core, as on the NRI path. `status["proxy"]`: disabled | serving | stopped.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from koordqos.bus import EventBus
    from koordqos.cgroups.layout import CgroupLayout
    from koordqos.config import HookSettings
    from koordqos.decisions import DecisionLog
    from koordqos.hooks.core import HookCore
    from koordqos.proxy.server import ProxyServer


def build_server(
    settings: HookSettings,
    bus: EventBus,
    layout: CgroupLayout,
    core: HookCore,
    decisions: DecisionLog,
    status: MutableMapping[str, Any],
) -> ProxyServer:
    """The RuntimeHookService server and its registration file."""
    from koordqos.config import parse_failure_policy
    from koordqos.hooks.context import Stage
    from koordqos.proxy.convert import ProxyConverter
    from koordqos.proxy.registration import RegistrationFile, proxy_stages, render_registration
    from koordqos.proxy.server import ProxyServer
    from koordqos.proxy.service import RuntimeHookService, core_handler

    policy = parse_failure_policy(settings.failure_policy)
    service = RuntimeHookService(
        bus,
        ProxyConverter(layout),
        policy,
        decisions=decisions,
        handler=core_handler(core),
        max_message_bytes=settings.proxy_max_message_bytes,
    )
    disabled = {Stage(s) for s in settings.disable_stages}
    registration = RegistrationFile(
        settings.proxy_config_path,
        # remote-endpoint: where the proxy on the host dials, not our (possibly in-container) listen path
        render_registration(
            settings.proxy_host_endpoint, policy, proxy_stages(core.hooks.registry, disabled)
        ),
    )
    return ProxyServer(
        service,
        settings.proxy_addr,
        registration,
        refresh_interval=settings.reconcile_interval_seconds,
        status=status,
        max_connections=settings.proxy_max_connections,
    )
