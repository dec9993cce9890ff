"""The agent as a subprocess (`python -m koordqos run`) in the scratch cgroup view, and the project's fake
API server on a thread for cluster mode. The agent's namespace has `/proc/sys` read-only and `--sys-root`
is an empty dir: it cannot write a host sysctl even by mistake."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from koordqos.testing.poll import wait_until_sync
from tests.support.agentproc import AgentLaunch, AgentPopen, agent_argv, agent_env, free_port

from .cgview import CGROUP_MNT, CgroupTree
from .prereq import POLL


@dataclass
class Agent:
    """`python -m koordqos run` in local mode, in the scratch cgroup view, on containerd's NRI socket."""

    tree: CgroupTree
    workdir: Path
    nri_socket: Path
    args: list[str] = field(default_factory=list)
    port: int = 0
    proc: AgentPopen | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"agent-{self.starts}.log"

    def start(self) -> None:
        self.port = free_port()
        sys_root = self.workdir / "sys"  # nothing under the host's /sys is the agent's business here
        sys_root.mkdir(exist_ok=True)
        self.starts += 1
        cmd = agent_argv(
            "--node-name",
            "e2e-node",
            "--cgroup-root",
            str(CGROUP_MNT),
            "--proc-root",
            "/proc",
            "--sys-root",
            str(sys_root),
            "--nri-socket",
            str(self.nri_socket),
            "--nri-backoff-cap-seconds",
            "1",
            "--http-addr",
            f"127.0.0.1:{self.port}",
            "--debug-endpoints",
            "--log-format",
            "json",
            *self.args,
        )
        env = agent_env(home=self.workdir)  # no ~/.kube/config: local mode
        argv = self.tree.wrap(cmd, read_only_proc_sys=True)
        self.proc = AgentPopen(AgentLaunch(argv, self.log_path, self.port, env)).start()

    def _get(self, path: str) -> bytes:
        proc = self.proc
        if proc is not None and proc.returncode is not None:
            raise AssertionError(f"the agent exited with {proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                body: bytes = resp.read()
                return body
        except urllib.error.HTTPError as exc:
            body = exc.read()
            return body

    def readyz(self) -> dict[str, Any]:
        """The /readyz body; {} while the agent is not listening yet (it is polled from start-up on)."""
        try:
            body = self._get("/readyz")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return {}
        doc: dict[str, Any] = json.loads(body)
        return doc

    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self._get("/debug/state"))
        return doc

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
        total = 0.0
        for line in self._get("/metrics").decode().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, lab = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in lab for k, v in labels.items()):
                total += float(value)
        return total

    def wait_connected(self, timeout: float = 60.0) -> None:
        """Until /readyz says the NRI plugin is registered with containerd."""
        wait_until_sync(
            lambda: self.readyz().get("nri_connected") is True, timeout, POLL, "the agent's NRI connection"
        )
        assert self.proc is not None
        self.tree.check_view(self.proc.pid)  # and it runs in the cgroup view the stack was built with

    def stop(self, timeout: float = 15.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        self.proc = None
        return proc.stop(timeout)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class ThreadedAPIServer:
    """`tests.support.fake_apiserver.FakeAPIServer` served from its own event loop in a thread, so the
    synchronous tests can use it; `upsert` is passed to that loop."""

    def __init__(self) -> None:
        import asyncio
        import threading

        from tests.support.fake_apiserver import FakeAPIServer

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-apiserver", daemon=True)
        self.api = FakeAPIServer()

    def __enter__(self) -> ThreadedAPIServer:
        self.thread.start()
        self._asyncio.run_coroutine_threadsafe(self.api.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._asyncio.run_coroutine_threadsafe(self.api.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def upsert(self, plural: str, obj: dict[str, Any]) -> None:
        async def do() -> None:
            self.api.upsert(plural, obj)

        self._asyncio.run_coroutine_threadsafe(do(), self.loop).result(30)

    def kubeconfig(self, path: Path) -> Path:
        return self.api.write_kubeconfig(path)
