"""The agent as the demo runs it: `python -m koordqos run` in local mode, as a subprocess
(`koordqos.testing.agentrunner` starts, waits for and stops it).

Pods come from the mock NRI runtime on a unix socket, the NodeSLO from a file (CPU suppress on, policy
cfsQuota, the demo's threshold), `--debug-endpoints` so the decisions can be read back as they happen.
Only CPU suppress acts: the other default-on strategies and hooks are switched off by gate, so the agent's
writes are the besteffort quota (and the cpuset recovery CPU suppress does with the cfsQuota policy).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from koordqos.testing.agentrunner import AgentLaunch, AsyncAgent, agent_argv, agent_env, free_port

SUPPRESS = "BECPUSuppress"
GATES = (
    "BECPUSuppress=true,CPUBurst=false,GroupIdentity=false,CPUSetAllocator=false,BatchResource=false,"
    "RdtResctrl=false,NodeTopologyReport=false"
)
LS_USED_METRIC = "koordqos_be_suppress_ls_used_cores"


def write_nodeslo(path: Path, threshold_percent: int, enable: bool = True) -> None:
    """The NodeSLO file of the demo (local mode polls it for changes)."""
    doc = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": "koordqos-demo"},
        "spec": {
            "resourceUsedThresholdWithBE": {
                "enable": enable,
                "cpuSuppressPolicy": "cfsQuota",
                "cpuSuppressThresholdPercent": threshold_percent,
            }
        },
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)


@dataclass
class AgentSpec:
    """How to start the agent."""

    cgroup_root: Path
    nri_socket: Path
    nodeslo_file: Path
    log_file: Path
    interval: float
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    port: int = field(default_factory=free_port)
    launcher: Sequence[str] = ()  # e.g. the nsexec prefix; the agent command follows it
    extra_args: Sequence[str] = ()

    def command(self) -> list[str]:
        """The full command line."""
        interval = f"{self.interval:g}"
        return agent_argv(
            "--cgroup-root",
            str(self.cgroup_root),
            "--proc-root",
            str(self.proc_root),
            "--sys-root",
            str(self.sys_root),
            "--nri-socket",
            str(self.nri_socket),
            "--nri-backoff-cap-seconds",
            "1",
            "--nodeslo-file",
            str(self.nodeslo_file),
            "--node-name",
            "koordqos-demo",
            "--http-addr",
            f"127.0.0.1:{self.port}",
            "--debug-endpoints",
            "--cpu-suppress-interval-seconds",
            interval,
            "--collect-interval",
            interval,
            f"--feature-gates={GATES}",
            "--log-format",
            "json",
            *self.extra_args,
            launcher=self.launcher,
        )

    def env(self) -> dict[str, str]:
        """The environment: no KOORDQOS_* or kubeconfig from the caller, so it runs in local mode."""
        return agent_env(home=self.log_file.parent)  # no ~/.kube/config either, nor in-cluster

    def launch(self) -> AgentLaunch:
        """The command, environment and log (appended to) of `koordqos.testing.agentrunner`; its own session,
        so the terminal's Ctrl-C reaches the demo only (the demo stops the agent)."""
        return AgentLaunch(
            self.command(), self.log_file, self.port, self.env(), append=True, new_session=True
        )


class AgentProcess(AsyncAgent):
    """A running agent (`koordqos.testing.agentrunner.AsyncAgent`: start, readiness, stop) and what the demo
    reads of it: decisions, the usage it saw, its own CPU time; pause and resume."""

    def __init__(self, spec: AgentSpec) -> None:
        super().__init__(spec.launch())
        self.spec = spec
        self._seen = 0.0  # decision time of the newest decision handed out

    @property
    def base(self) -> str:
        """The agent's HTTP address."""
        return f"http://127.0.0.1:{self.spec.port}"

    def failure_tail(self) -> str:
        """One line for the demo's error: the log's last 5 lines."""
        return " " + self.tail_log()

    async def new_decisions(self, strategies: Sequence[str] = (SUPPRESS,)) -> list[dict[str, Any]]:
        """The decisions of `strategies` (CPU suppress by default) made since the previous call, oldest
        first."""
        if not self.started:
            return []
        items: list[dict[str, Any]] = []
        try:
            for strategy in strategies:
                async with self.http.get(
                    f"{self.base}/debug/decisions", params={"strategy": strategy, "limit": "200"}
                ) as resp:
                    items += await resp.json()
        except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError):
            return []
        items.sort(key=lambda d: float(d["time"]))
        fresh = [d for d in items if d["time"] > self._seen]
        if fresh:
            self._seen = max(d["time"] for d in fresh)
        return fresh

    async def ls_used_cores(self) -> float | None:
        """What CPU suppress last counted as non-BE + system usage (gauge); None before its first round."""
        if not self.started:
            return None
        try:
            async with self.http.get(f"{self.base}/metrics") as resp:
                text = await resp.text()
        except (TimeoutError, aiohttp.ClientError):
            return None
        for line in text.splitlines():
            if line.startswith(LS_USED_METRIC + " "):
                return float(line.split()[1])
        return None

    def cpu_seconds(self) -> float:
        """The agent's own CPU time so far (user + system)."""
        if not self.started:
            return 0.0
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def pause(self) -> None:
        """SIGSTOP: the agent neither acts nor costs CPU (benchmark phases without the agent)."""
        self.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        self.send_signal(signal.SIGCONT)

    def tail_log(self, lines: int = 5) -> str:
        """The last lines of the agent's log on one line (for error messages)."""
        return self.log_tail(lines, " | ")

    async def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (resumed first), up to `timeout` s, SIGKILL if needed; the exit code."""
        return await super().stop(timeout)
