"""The agent as the tests start it: `python -m koordqos run` as a subprocess, its environment and readiness.

One place for what every end-to-end test repeated: a free port, an environment that does not leak the caller's
`KOORDQOS_*` settings (or kubeconfig, in local mode), the cluster-mode command line for a synthetic node and
a fake API server, and waiting until an HTTP endpoint answers.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import aiohttp

from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_env(*, home: Path | None = None) -> dict[str, str]:
    """This process's environment without `KOORDQOS_*`.

    With `home` (local mode): no `KUBECONFIG` either and `HOME` set there, so no ~/.kube/config is found.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOORDQOS_")}
    if home is not None:
        env.pop("KUBECONFIG", None)
        env["HOME"] = str(home)
    return env


def agent_argv(*args: str) -> list[str]:
    """`python -m koordqos run ARGS...` with this interpreter."""
    return [sys.executable, "-m", "koordqos", "run", *args]


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


async def wait_ready(port: int, timeout: float) -> None:
    """Wait until the agent on 127.0.0.1:`port` answers /readyz with 200."""
    await wait_for_http(f"http://127.0.0.1:{port}/readyz", 200, timeout)
