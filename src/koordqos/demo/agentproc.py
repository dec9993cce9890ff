"""The agent as the demo runs it: `python -m koordqos run` in local mode, as a subprocess.

Pods come from the mock NRI runtime on a unix socket, the NodeSLO from a file (CPU suppress on, policy
cfsQuota, the demo's threshold), `--debug-endpoints` so the decisions can be read back as they happen.
Only CPU suppress acts: the other default-on strategies and hooks are switched off by gate, so the agent's
writes are the besteffort quota (and the cpuset recovery CPU suppress does with the cfsQuota policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

SUPPRESS = "BECPUSuppress"
GATES = (
    "BECPUSuppress=true,CPUBurst=false,GroupIdentity=false,CPUSetAllocator=false,BatchResource=false,"
    "RdtResctrl=false,NodeTopologyReport=false"
)
LS_USED_METRIC = "koordqos_be_suppress_ls_used_cores"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        return [
            *self.launcher,
            sys.executable,
            "-m",
            "koordqos",
            "run",
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
        ]

    def env(self) -> dict[str, str]:
        """The environment: no KOORDQOS_* or kubeconfig from the caller, so it runs in local mode."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KOORDQOS_") and k != "KUBECONFIG"}
        env["HOME"] = str(self.log_file.parent)  # no ~/.kube/config either
        env.pop("KUBERNETES_SERVICE_HOST", None)  # not in-cluster
        return env


class AgentProcess:
    """A running agent: readiness, decisions, the usage it saw, its own CPU time."""

    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self.ready_at: float | None = None
        self._session: aiohttp.ClientSession | None = None
        self._seen = 0.0  # decision time of the newest decision handed out
        self._log: Any = None

    @property
    def base(self) -> str:
        """The agent's HTTP address."""
        return f"http://127.0.0.1:{self.spec.port}"

    async def start(self) -> None:
        """Start the process (stdout/stderr to the log file)."""
        self._log = self.spec.log_file.open("ab")
        self.started_at = time.monotonic()
        self.proc = await asyncio.create_subprocess_exec(
            *self.spec.command(),
            env=self.spec.env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,  # the terminal's Ctrl-C reaches the demo only; the demo stops the agent
        )
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))

    async def wait_ready(self, timeout: float) -> float:
        """Seconds from start to /readyz 200; RuntimeError if it exits or does not become ready in time."""
        assert self.proc is not None
        assert self._session is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise RuntimeError(f"the agent exited with {self.proc.returncode}: {self.tail_log()}")
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with self._session.get(f"{self.base}/readyz") as resp:
                    if resp.status == 200:
                        self.ready_at = time.monotonic()
                        return self.ready_at - self.started_at
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the agent did not become ready within {timeout:.0f} s: {self.tail_log()}")

    async def new_decisions(self, strategies: Sequence[str] = (SUPPRESS,)) -> list[dict[str, Any]]:
        """The decisions of `strategies` (CPU suppress by default) made since the previous call, oldest
        first."""
        if self._session is None:
            return []
        items: list[dict[str, Any]] = []
        try:
            for strategy in strategies:
                async with self._session.get(
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
        if self._session is None:
            return None
        try:
            async with self._session.get(f"{self.base}/metrics") as resp:
                text = await resp.text()
        except (TimeoutError, aiohttp.ClientError):
            return None
        for line in text.splitlines():
            if line.startswith(LS_USED_METRIC + " "):
                return float(line.split()[1])
        return None

    def cpu_seconds(self) -> float:
        """The agent's own CPU time so far (user + system)."""
        if self.proc is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def pause(self) -> None:
        """SIGSTOP: the agent neither acts nor costs CPU (benchmark phases without the agent)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)

    def tail_log(self, lines: int = 5) -> str:
        """The last lines of the agent's log (for error messages)."""
        try:
            text = self.spec.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; the exit code."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            self.resume()
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def kill_now(self) -> None:
        """Synchronous last-resort stop (exit guard, when the event loop is gone)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
