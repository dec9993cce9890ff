"""The agent as a real subprocess in cluster mode against the real API server, on a synthetic node."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from koordqos.testing.nodefs import SyntheticNode
from tests.support.agentproc import agent_argv, agent_env, free_port

from .controlplane import ControlPlane
from .kubeobjects import eventually


@dataclass
class AgentProcess:
    """A running `python -m koordqos run` and its HTTP port (debug endpoints on)."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def _get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            return self._get("/readyz")[0] == 200
        except OSError:
            return False

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

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_records(self) -> list[dict[str, Any]]:
        """The agent's JSON log lines."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
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
    env = agent_env()
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
    log = workdir / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    agent = AgentProcess(proc, port, log)
    try:
        eventually(agent.ready, 60, "agent ready (pods, Node and NodeSLO listed)")
        yield agent
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, agent.log_tail()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
