"""Proxy mode: the RuntimeHookService koord-runtime-proxy calls around each CRI call (grpclib, unix socket).

`setup(ctx)` (when `--enable-runtime-hooks-proxy`): attaches `ProxyHooks` (the "runtime_hooks" runner from
`koordqos.hooks`, so hooks behave as on the NRI path) to the proxy bus request events, and returns the
`ProxyServer` component (service "proxy_server") serving `--runtime-hooks-addr` and keeping
`<--runtime-hooks-config-path>/koordlet.json` current. `ctx.status["proxy"]`: disabled | serving | stopped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component


def setup(ctx: AgentContext) -> list[Component]:
    """Create the RuntimeHookService server component (or record that proxy mode is disabled)."""
    cfg = ctx.config.hooks
    if not cfg.proxy_enabled:
        ctx.status["proxy"] = "disabled"
        return []
    from koordqos.cgroups.layout import CgroupLayout
    from koordqos.hooks.context import Stage
    from koordqos.hooks.framework import parse_failure_policy
    from koordqos.hooks.runtime import RuntimeHooks
    from koordqos.proxy.convert import ProxyConverter
    from koordqos.proxy.registration import RegistrationFile, proxy_stages, render_registration
    from koordqos.proxy.runner import ProxyHooks
    from koordqos.proxy.server import ProxyServer
    from koordqos.proxy.service import RuntimeHookService

    hooks: RuntimeHooks = ctx.service("runtime_hooks")
    layout: CgroupLayout = ctx.service("cgroup_layout")
    policy = parse_failure_policy(cfg.failure_policy)
    ProxyHooks(hooks, ctx.services.get("executor"), policy).register(ctx.bus)
    service = RuntimeHookService(ctx.bus, ProxyConverter(layout), policy, decisions=ctx.decisions)
    registration = RegistrationFile(
        cfg.proxy_config_path,
        render_registration(
            str(cfg.proxy_addr), policy, proxy_stages(hooks.registry, {Stage(s) for s in cfg.disable_stages})
        ),
    )
    server = ProxyServer(
        service,
        cfg.proxy_addr,
        registration,
        refresh_interval=cfg.reconcile_interval_seconds,
        status=ctx.status,
    )
    ctx.services["proxy_server"] = server
    return [server]
