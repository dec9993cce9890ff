"""The agent's configuration → the reporters' typed inputs (for the composer and `report --once`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from koordqos.config import AgentConfig
from koordqos.kube.client import KubeClient
from koordqos.report.kubelet import KubeletCPUManager, topology_policy
from koordqos.report.reporters import KubeletSources

ClientSource = KubeClient | Callable[[], Awaitable[KubeClient]]


def explicit_kubelet(cfg: AgentConfig) -> KubeletCPUManager | None:
    """PD-10 source (1): the kubelet settings given to the agent, None when no policy is configured."""
    r = cfg.report
    if not r.kubelet_cpu_manager_policy:
        return None
    return KubeletCPUManager(
        policy=r.kubelet_cpu_manager_policy,
        options=dict(r.kubelet_cpu_manager_policy_options),
        reserved_cpus=r.kubelet_reserved_cpus if r.kubelet_cpu_manager_policy == "static" else "",
        topology_policy=topology_policy(r.kubelet_topology_manager_scope, r.kubelet_topology_manager_policy),
        source="config",
    )


def configz_fetcher(client: ClientSource, node_name: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    """PD-10 source (2): the kubelet's /configz through the API server's node proxy (`nodes/proxy` get)."""

    async def fetch() -> dict[str, Any]:
        c = client if isinstance(client, KubeClient) else await client()
        return await c.request("GET", f"/api/v1/nodes/{node_name}/proxy/configz", timeout=10.0)

    return fetch


def kubelet_sources(cfg: AgentConfig, client: ClientSource | None) -> KubeletSources:
    """All PD-10 sources the configuration allows."""
    fetch = None
    if client is not None and not cfg.report.disable_query_kubelet_config:
        fetch = configz_fetcher(client, cfg.node_name)
    return KubeletSources(explicit_kubelet(cfg), fetch, cfg.report.kubelet_root)
