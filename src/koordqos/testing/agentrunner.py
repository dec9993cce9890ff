"""The agent as a subprocess: `python -m koordqos run`, its environment, start, readiness, log and stop.

The one implementation the demo, the benchmarks and the tests start the agent with (the tests reach it
through `tests/support/agentproc.py`, which adds their cluster-mode command lines). It is product code
because the demo (`koordqos.demo`) needs it and the wheel ships no test tooling.

- `free_port`, `agent_argv` (this interpreter, `-m koordqos run ARGS`), `agent_env` (the caller's
  environment without `KOORDQOS_*`; with `home`, local mode: no kubeconfig, no in-cluster service);
- `AgentLaunch`: what to start (argv, environment, the HTTP port readiness is polled on, the log file its
  stdout and stderr go to);
- `AgentPopen` (blocking, `subprocess.Popen`) and `AsyncAgent` (asyncio): start, poll `/readyz` until 200
  with `koordqos.testing.poll` (an exit meanwhile fails at once, with the log's tail), stop (SIGTERM, a
  deadline, then SIGKILL) returning the exit code for the caller to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import aiohttp

from koordqos.testing.poll import ConditionTimeout, wait_until, wait_until_sync

HOST = "127.0.0.1"
READY_INTERVAL = 0.05  # seconds between two /readyz polls
STOP_TIMEOUT = 20.0  # seconds from SIGTERM to SIGKILL


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def agent_argv(
    *args: str, launcher: Sequence[str] = (), entry: Sequence[str] = ("-m", "koordqos")
) -> list[str]:
    """`python -m koordqos run ARGS...` with this interpreter, after `launcher` (e.g. the demo's nsexec);
    `entry` runs the agent's CLI some other way (e.g. under a tracer that hands on to it)."""
    return [*launcher, sys.executable, *entry, "run", *args]


def agent_env(*, home: Path | None = None) -> dict[str, str]:
    """This process's environment without `KOORDQOS_*`.

    With `home` (local mode): `HOME` set there and no `KUBECONFIG`, so no kubeconfig is found, and no
    `KUBERNETES_SERVICE_HOST`, so no in-cluster configuration either.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOORDQOS_")}
    if home is not None:
        env.pop("KUBECONFIG", None)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["HOME"] = str(home)
    return env


class AgentNotReady(RuntimeError):
    """The agent exited, or did not answer /readyz with 200 in time."""


@dataclass
class AgentLaunch:
    """How to start the agent: `argv` (see `agent_argv`), stdout and stderr to `log`."""

    argv: Sequence[str]
    log: Path
    port: int | None = None  # its HTTP port on 127.0.0.1 (readiness, `url`); None: not polled
    env: Mapping[str, str] = field(default_factory=agent_env)
    append: bool = False  # add to `log` rather than start it anew
    new_session: bool = False  # its own session: a terminal's Ctrl-C does not reach it

    def url(self, path: str) -> str:
        """`http://127.0.0.1:PORT/path`."""
        if self.port is None:
            raise ValueError("the agent was launched without an HTTP port")
        return f"http://{HOST}:{self.port}{path}"

    def log_text(self) -> str:
        """Everything the agent wrote so far ('' before it wrote anything)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40, sep: str = "\n") -> str:
        """The last `lines` lines of its log (for failure messages)."""
        return sep.join(self.log_text().strip().splitlines()[-lines:])


class _Agent:
    """What both variants share: the launch, the open log, the start time, failure messages."""

    def __init__(self, launch: AgentLaunch) -> None:
        self.launch = launch
        self.started_at = 0.0
        self.ready_at: float | None = None
        self._log: IO[bytes] | None = None

    @property
    def port(self) -> int | None:
        return self.launch.port

    def url(self, path: str) -> str:
        """`http://127.0.0.1:PORT/path`."""
        return self.launch.url(path)

    def log_text(self) -> str:
        """Everything the agent wrote so far."""
        return self.launch.log_text()

    def log_tail(self, lines: int = 40, sep: str = "\n") -> str:
        """The last lines of its log."""
        return self.launch.log_tail(lines, sep)

    def _open_log(self) -> IO[bytes]:
        self.launch.log.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.launch.log.open("ab" if self.launch.append else "wb")
        self.started_at = time.monotonic()
        return self._log

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def failure_tail(self) -> str:
        """What a failure message ends with: a newline and the log's last 40 lines."""
        return "\n" + self.log_tail()

    def _exited(self, code: int) -> AgentNotReady:
        return AgentNotReady(f"the agent exited with {code}:{self.failure_tail()}")

    def _not_ready(self, timeout: float) -> AgentNotReady:
        return AgentNotReady(f"the agent did not become ready within {timeout:g} s:{self.failure_tail()}")

    def _became_ready(self) -> float:
        self.ready_at = time.monotonic()
        return self.ready_at - self.started_at


def terminate(proc: subprocess.Popen[Any], timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM to `proc` if it still runs, up to `timeout` s to exit, then SIGKILL; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class AgentPopen(_Agent):
    """The agent as a `subprocess.Popen` (for tests without an event loop, or that block while it runs)."""

    def __init__(self, launch: AgentLaunch) -> None:
        super().__init__(launch)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("the agent was not started")
        return self._proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Its exit code; None while it runs."""
        return self.proc.poll()

    def start(self) -> Self:
        log = self._open_log()
        self._proc = subprocess.Popen(
            list(self.launch.argv),
            env=dict(self.launch.env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=self.launch.new_session,
        )
        return self

    def ready(self) -> bool:
        """Whether /readyz answers 200; AgentNotReady if the agent exited."""
        if (code := self.returncode) is not None:
            raise self._exited(code)
        try:
            with urllib.request.urlopen(self.url("/readyz"), timeout=5) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False
        except OSError:  # not listening yet
            return False

    def wait_ready(self, timeout: float) -> float:
        """Seconds from start to /readyz 200; AgentNotReady if it exits or is not ready in time."""
        try:
            wait_until_sync(self.ready, timeout, READY_INTERVAL, "the agent's /readyz 200")
        except ConditionTimeout:
            raise self._not_ready(timeout) from None
        return self._became_ready()

    def wait(self, timeout: float) -> int:
        """Its exit code once it exits by itself (subprocess.TimeoutExpired after `timeout`)."""
        return self.proc.wait(timeout)

    def send_signal(self, sig: int) -> None:
        """`sig` to the agent if it still runs."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, up to `timeout` s to exit, then SIGKILL; its exit code (negative: the signal)."""
        code = terminate(self.proc, timeout)
        self._close_log()
        return code

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self.stop()


class AsyncAgent(_Agent):
    """The agent as an asyncio subprocess."""

    def __init__(self, launch: AgentLaunch) -> None:
        super().__init__(launch)
        self._proc: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def proc(self) -> asyncio.subprocess.Process:
        if self._proc is None:
            raise RuntimeError("the agent was not started")
        return self._proc

    @property
    def started(self) -> bool:
        return self._proc is not None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Its exit code; None while it runs."""
        return self.proc.returncode

    @property
    def http(self) -> aiohttp.ClientSession:
        """A client session for the agent's endpoints (2 s per request), closed by `stop`."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        return self._http

    async def start(self) -> Self:
        log = self._open_log()
        self._proc = await asyncio.create_subprocess_exec(
            *self.launch.argv,
            env=dict(self.launch.env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=self.launch.new_session,
        )
        return self

    async def ready(self) -> bool:
        """Whether /readyz answers 200; AgentNotReady if the agent exited."""
        if (code := self.returncode) is not None:
            raise self._exited(code)
        try:
            async with self.http.get(self.url("/readyz")) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def wait_ready(self, timeout: float) -> float:
        """Seconds from start to /readyz 200; AgentNotReady if it exits or is not ready in time."""
        try:
            await wait_until(self.ready, timeout, READY_INTERVAL, "the agent's /readyz 200")
        except ConditionTimeout:
            raise self._not_ready(timeout) from None
        return self._became_ready()

    async def wait(self, timeout: float) -> int:
        """Its exit code once it exits by itself (TimeoutError after `timeout`)."""
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def send_signal(self, sig: int) -> None:
        """`sig` to the agent if it still runs."""
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    async def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (after SIGCONT, should it be stopped), up to `timeout` s to exit, then SIGKILL; its exit
        code (negative: the signal)."""
        if self._http is not None:
            await self._http.close()
            self._http = None
        proc = self.proc
        if proc.returncode is None:
            self.send_signal(signal.SIGCONT)
            self.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self._close_log()
        assert proc.returncode is not None
        return proc.returncode

    def kill_now(self) -> None:
        """Synchronous last-resort stop (an exit guard, when the event loop is gone)."""
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGCONT)
                os.kill(self._proc.pid, signal.SIGKILL)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            await self.stop()
