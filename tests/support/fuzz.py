"""Hostile-input harness: the agent as a subprocess, fed mutated NRI requests and proxy messages.

`FuzzTarget` starts a mock NRI runtime in this process and the agent (`python -m koordqos run`, local mode)
against the colocation scenario's synthetic node, with the proxy hook server on a unix socket. The seeds are
the valid requests of that scenario; `Mutator` derives hostile variants (bit flips, truncation, inserted,
repeated or overlong-length bytes) that keep the transport framing intact, so each one is a request the agent
must answer. `nri_call` / `proxy_call` classify what came back; `FuzzTarget.vitals()` reads the agent's RSS
and open fds from /proc. Used by `tests/hostile/` (seconds) and `bench/fuzz.py` (the long run).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, StreamTerminatedError

from koordqos.errors import TimeoutException
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.connection import ConnectionClosedError
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.testing.mock_nri.protocol import PLUGIN_SERVICE
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.scenarios import Scenario, colocation
from koordqos.testing.poll import wait_until
from tests.support.agentproc import AgentLaunch, AgentPopen, agent_argv, agent_env

REPO_ROOT = Path(__file__).resolve().parents[2]  # tests/support/fuzz.py → the repository

PROXY_SERVICE = "/runtime.v1alpha1.RuntimeHookService/"


class Mutator:
    """Deterministic (seeded) byte mutations of a valid message."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def mutate(self, data: bytes) -> bytes:
        """One to four mutations of `data`."""
        buf = bytearray(data)
        for _ in range(self.rng.randint(1, 4)):
            buf = self._one(buf)
        return bytes(buf)

    def _one(self, buf: bytearray) -> bytearray:
        rng = self.rng
        op = rng.randrange(7)
        n = len(buf)
        if op == 0 and n:  # flip one bit
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # truncate
            del buf[rng.randrange(n) :]
        elif op == 2:  # insert random bytes
            i = rng.randrange(n + 1)
            buf[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and n:  # a byte at an extreme (varint continuation, huge lengths, tag 0)
            buf[rng.randrange(n)] = rng.choice((0x00, 0x7F, 0x80, 0xFF))
        elif op == 4 and n:  # repeat a slice (duplicate fields, long strings)
            i = rng.randrange(n)
            j = min(n, i + rng.randint(1, 64))
            buf[j:j] = buf[i:j] * rng.randint(1, 32)
        elif op == 5:  # an overlong length-delimited field at the end
            buf += bytes((rng.choice((0x0A, 0x12, 0x1A, 0x22)),)) + b"\xff\xff\xff\xff\x0f"
        else:  # replace everything with noise
            buf = bytearray(rng.randbytes(rng.randint(0, 64)))
        return buf


def nri_seeds(scenario: Scenario) -> list[tuple[str, bytes]]:
    """Valid plugin-service requests (method, payload) for the scenario's pods and containers."""
    pods = {p.id: p for p in scenario.pods}
    out: list[tuple[str, bytes]] = []
    for pod in scenario.pods:
        out.append(("RunPodSandbox", api.RunPodSandboxRequest(pod=pod).SerializeToString()))
        out.append(("StopPodSandbox", api.StopPodSandboxRequest(pod=pod).SerializeToString()))
    for ctr in scenario.containers:
        pod = pods[ctr.pod_sandbox_id]
        out.append(
            ("CreateContainer", api.CreateContainerRequest(pod=pod, container=ctr).SerializeToString())
        )
        upd = api.UpdateContainerRequest(pod=pod, container=ctr)
        upd.linux_resources.CopyFrom(ctr.linux.resources)
        out.append(("UpdateContainer", upd.SerializeToString()))
        out.append(("StopContainer", api.StopContainerRequest(pod=pod, container=ctr).SerializeToString()))
        sc = api.StateChangeEvent(event=api.START_CONTAINER, pod=pod, container=ctr)
        out.append(("StateChange", sc.SerializeToString()))
    return out


def proxy_seeds(scenario: Scenario) -> list[tuple[str, bytes]]:
    """Valid RuntimeHookService requests (method, payload) for the scenario's pods and containers."""
    out: list[tuple[str, bytes]] = []
    by_id = {p.id: p for p in scenario.pods}
    for pod in scenario.pods:
        meta = rpb.PodSandboxMetadata(name=pod.name, namespace=pod.namespace, uid=pod.uid)
        req = rpb.PodSandboxHookRequest(
            pod_meta=meta,
            labels=dict(pod.labels),
            annotations=dict(pod.annotations),
            cgroup_parent=pod.linux.cgroup_parent,
        )
        out.append(("PreRunPodSandboxHook", req.SerializeToString()))
        out.append(("PostStopPodSandboxHook", req.SerializeToString()))
    for ctr in scenario.containers:
        pod = by_id[ctr.pod_sandbox_id]
        creq = rpb.ContainerResourceHookRequest(
            pod_meta=rpb.PodSandboxMetadata(name=pod.name, namespace=pod.namespace, uid=pod.uid),
            container_meta=rpb.ContainerMetadata(name=ctr.name, id=ctr.id),
            pod_labels=dict(pod.labels),
            pod_annotations=dict(pod.annotations),
            pod_cgroup_parent=pod.linux.cgroup_parent,
            container_envs={"A": "1"},
        )
        creq.container_resources.cpu_shares = ctr.linux.resources.cpu.shares.value
        creq.container_resources.memory_limit_in_bytes = ctr.linux.resources.memory.limit.value
        for method in ("PreCreateContainerHook", "PreStartContainerHook", "PreUpdateContainerResourcesHook"):
            out.append((method, creq.SerializeToString()))
        out.append(("PostStopContainerHook", creq.SerializeToString()))
    return out


class RawCodec(CodecBase):
    """grpclib codec passing bytes through: the fuzzer sends payloads no message class would build."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        """Bytes as they are."""
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        """Bytes as they are."""
        return data


async def nri_call(rt: MockRuntime, method: str, payload: bytes, timeout: float) -> str:
    """One plugin-service call: "ok", "status:<code>" (an error reply), "dropped" or "hang"."""
    link = rt.link
    if link is None or link.dropped.is_set():
        return "dropped"
    try:
        resp = await link.conn.call(PLUGIN_SERVICE, method, payload, timeout)
    except TimeoutException:
        return "hang"
    except ConnectionClosedError:
        return "dropped"
    return f"status:{resp.status.code}" if resp.status.code else "ok"


async def proxy_call(channel: Channel, method: str, payload: bytes, timeout: float) -> str:
    """One unary RuntimeHookService call: "ok", "grpc:<status name>", "closed" or "hang"."""
    try:
        async with asyncio.timeout(timeout):
            async with channel.request(
                PROXY_SERVICE + method, Cardinality.UNARY_UNARY, bytes, bytes, timeout=timeout
            ) as stream:
                await stream.send_message(payload, end=True)
                await stream.recv_message()
                await stream.recv_trailing_metadata()
    except TimeoutError:
        return "hang"
    except GRPCError as exc:
        return f"grpc:{exc.status.name}"
    except (StreamTerminatedError, ConnectionError, OSError):
        return "closed"
    return "ok"


@dataclass(frozen=True)
class Vitals:
    """The agent process's resident memory and open file descriptors."""

    rss_kib: int
    fds: int
    anon_kib: int = 0  # RssAnon: the heap; the rest of RSS is file pages (code, libraries) and shared memory


class FuzzTarget:
    """A mock runtime (in this process) and the agent subprocess on the colocation scenario's node."""

    def __init__(
        self,
        request_timeout: float = 5.0,
        extra_args: tuple[str, ...] = (),
        heap_profile: Path | None = None,
        footprint: Path | None = None,
        agent_env: Mapping[str, str] | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kqfuzz-", dir="/tmp"))  # short: unix socket paths
        self.scenario = colocation(self.dir / "node")
        self.nri_sock = self.dir / "nri.sock"
        self.proxy_sock = self.dir / "hooks.sock"
        self.runtime = MockRuntime(self.nri_sock, request_timeout=request_timeout)
        self.runtime.pods, self.runtime.containers = self.scenario.pods, self.scenario.containers
        self.extra_args = extra_args
        # the agent's environment is this process's without KOORDQOS_*, plus these (e.g. KOORDQOS_GC_POLICY)
        self.agent_env = dict(agent_env or {})
        self.proc: AgentPopen | None = None
        self.log = self.dir / "agent.log"
        self.channel: Channel | None = None
        # run the agent under tests.support.heaptrace, snapshots as <heap_profile>/heap.<n>.snap
        self.heap_profile = heap_profile
        self._heap_dumps = 0
        # footprint reports (tests.support.heaptrace.footprint) as <footprint>/heap.footprint.<n>.json
        self.footprint_dir = footprint
        self._footprints = 0

    @staticmethod
    def seed_scenario() -> Scenario:
        """The scenario's pods without a running target (seeds for test parametrization)."""
        base = Path(tempfile.mkdtemp(prefix="kqseed-", dir="/tmp"))
        try:
            return colocation(base)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    @property
    def pid(self) -> int:
        """The agent's pid."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """The agent process is still running."""
        return self.proc is not None and self.proc.returncode is None

    def vitals(self) -> Vitals:
        """RSS (VmRSS, RssAnon) and open fds of the agent, from /proc."""
        rss = anon = 0
        with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
        return Vitals(rss, len(os.listdir(f"/proc/{self.pid}/fd")), anon)

    async def __aenter__(self) -> FuzzTarget:
        try:
            return await self._start()
        except BaseException:
            await self.__aexit__(None, None, None)  # an agent that never joined must not outlive the bench
            raise

    async def _start(self) -> FuzzTarget:
        await self.runtime.start()
        node = self.scenario.node
        env = agent_env(home=self.dir)  # no ~/.kube/config: local mode
        env.update(self.agent_env)
        entry = ["-m", "koordqos"]
        traced = self.heap_profile or self.footprint_dir
        if traced is not None:
            for d in (self.heap_profile, self.footprint_dir):
                if d is not None:
                    d.mkdir(parents=True, exist_ok=True)
            entry = ["-m", "tests.support.heaptrace", str(traced / "heap")]
            # the tracer is test tooling, not in the wheel: the agent finds it from the repository root
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO_ROOT)) if p)
        argv = agent_argv(
            "--nri-socket",
            str(self.nri_sock),
            "--cgroup-root",
            str(node.cgroup_root),
            "--proc-root",
            str(node.proc_root),
            "--sys-root",
            str(node.sys_root),
            "--nodeslo-file",
            str(self.scenario.nodeslo_file),
            "--http-addr",
            "127.0.0.1:0",
            "--enable-runtime-hooks-proxy",
            "--runtime-hooks-addr",
            str(self.proxy_sock),
            "--runtime-hooks-config-path",
            str(self.dir / "hookserver.d"),
            "--log-format",
            "json",
            "--log-level",
            "error",
            *self.extra_args,
            entry=entry,
        )
        self.proc = AgentPopen(AgentLaunch(argv, self.log, env=env)).start()
        await self.runtime.wait_joined(timeout=60)
        await wait_until(self.proxy_sock.exists, timeout=30, message="the proxy hook socket")
        self.channel = Channel(path=str(self.proxy_sock), codec=RawCodec())
        return self

    async def heap_snapshot(self, timeout: float = 120.0) -> Path:
        """Ask the agent (started with `heap_profile`) for a tracemalloc snapshot; the file once written."""
        assert self.heap_profile is not None
        assert self.proc is not None
        path = self.heap_profile / f"heap.{self._heap_dumps}.snap"
        self._heap_dumps += 1
        self.proc.send_signal(signal.SIGUSR1)
        await wait_until(path.exists, timeout=timeout, message=f"heap snapshot {path}")
        return path

    async def footprint(self, timeout: float = 120.0) -> dict[str, Any]:
        """Ask the agent (started with `footprint`) for a footprint report (RSS, pymalloc, the largest
        containers): `tests.support.heaptrace.footprint`."""
        assert self.footprint_dir is not None
        assert self.proc is not None
        traced = self.heap_profile or self.footprint_dir
        path = traced / f"heap.footprint.{self._footprints}.json"
        self._footprints += 1
        self.proc.send_signal(signal.SIGUSR2)
        await wait_until(path.exists, timeout=timeout, message=f"footprint {path}")
        report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if self.footprint_dir != traced:
            path.rename(self.footprint_dir / path.name)
        return report

    async def nri(self, method: str, payload: bytes, timeout: float = 5.0) -> str:
        """`nri_call` on the current link; after "dropped", wait until the plugin has joined again."""
        link = self.runtime.link
        outcome = await nri_call(self.runtime, method, payload, timeout)
        if outcome == "dropped":
            after = self.runtime.links.index(link) + 1 if link is not None else 0
            await self.runtime.wait_joined(timeout=60, after=after)
        return outcome

    async def break_stream(self, data: bytes) -> bool:
        """Write `data` raw on the current link (a byte stream the plugin cannot resync), then wait until the
        plugin has joined again; False when the link was already gone."""
        link = await self.runtime.wait_joined(timeout=60, after=0)
        try:
            self.runtime.inject(data, link)
        except ConnectionClosedError:
            return False
        await self.runtime.wait_joined(timeout=60, after=self.runtime.links.index(link) + 1)
        return True

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None:
            await asyncio.to_thread(self.proc.stop, 15)
        await self.runtime.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def agent_log(self) -> str:
        """What the agent printed (errors only at the level the harness starts it with)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""
