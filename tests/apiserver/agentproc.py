"""The agent as a real subprocess in cluster mode against the real API server, on a synthetic node: the
cluster-mode flags for `koordqos.testing.agentrunner`'s one helper, and the debug endpoints read back."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from koordqos.testing.nodefs import SyntheticNode
from tests.support.agentproc import AgentLaunch, AgentPopen, agent_argv, free_port

from .controlplane import ControlPlane


class AgentProcess(AgentPopen):
    """A running `python -m koordqos run` (debug endpoints on) and what the tests read of it."""

    def _get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def state(self) -> dict[str, Any]:
        """/debug/state."""
        status, body = self._get("/debug/state")
        assert status == 200, body
        return dict(body)

    def decisions(self) -> list[dict[str, Any]]:
        """/debug/decisions."""
        status, body = self._get("/debug/decisions")
        assert status == 200, body
        return list(body)

    def log_records(self) -> list[dict[str, Any]]:
        """The agent's JSON log lines."""
        out = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
        return out


@contextlib.contextmanager
def running_agent(
    cp: ControlPlane,
    node: SyntheticNode,
    node_name: str,
    workdir: Path,
    *extra: str,
    token: str | None = None,
    server: str | None = None,
) -> Iterator[AgentProcess]:
    """The agent with a kubeconfig holding the agent token (bound to the chart's ClusterRole only).

    Ready means pods, Node and NodeSLO have listed; on exit it gets SIGTERM and must exit 0.
    """
    kubeconfig = cp.write_kubeconfig(workdir / "agent-kubeconfig", token or cp.agent_token, server)
    port = free_port()
    cmd = agent_argv(
        f"--kubeconfig={kubeconfig}",
        f"--node-name={node_name}",
        f"--cgroup-root={node.cgroup_root}",
        f"--proc-root={node.proc_root}",
        f"--sys-root={node.sys_root}",
        "--enable-nri=false",
        f"--http-addr=127.0.0.1:{port}",
        "--debug-endpoints",
        "--log-format=json",
        *extra,
    )
    with AgentProcess(AgentLaunch(cmd, workdir / "agent.log", port)) as agent:
        agent.wait_ready(60)  # pods, Node and NodeSLO listed
        yield agent
        assert agent.stop(20) == 0, agent.log_tail()
