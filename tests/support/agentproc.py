"""The agent as the tests start it: `koordqos.testing.agentrunner` (the one implementation: command line,
environment, start, readiness, log, stop and the one `free_port`, shared with the demo) and what only tests
need on top: the cluster-mode command line for a synthetic node and a fake API server, and waiting until an
HTTP endpoint answers a given status.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from koordqos.testing.agentrunner import (
    AgentLaunch,
    AgentNotReady,
    AgentPopen,
    AsyncAgent,
    agent_argv,
    agent_env,
    free_port,
)
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

__all__ = [
    "AgentLaunch",
    "AgentNotReady",
    "AgentPopen",
    "AsyncAgent",
    "agent_argv",
    "agent_env",
    "cluster_agent_argv",
    "free_port",
    "wait_for_http",
]


def cluster_agent_argv(
    kubeconfig: Path, node_name: str, node: SyntheticNode, port: int, *extra: str
) -> list[str]:
    """The agent in cluster mode on a synthetic node, HTTP on 127.0.0.1:`port`, JSON logs, then `extra`."""
    return agent_argv(
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        node_name,
        *node.root_flags(),
        "--http-addr",
        f"127.0.0.1:{port}",
        "--log-format",
        "json",
        *extra,
    )


async def wait_for_http(url: str, status: int, timeout: float) -> None:
    """Wait until `url` answers with `status` (connection errors count as not yet)."""
    async with aiohttp.ClientSession() as http:

        async def answers() -> bool:
            try:
                async with http.get(url) as resp:
                    return resp.status == status
            except aiohttp.ClientError:
                return False

        await wait_until(answers, timeout=timeout, interval=0.05, message=f"{url} to answer {status}")
