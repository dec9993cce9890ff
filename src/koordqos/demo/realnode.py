"""The real-kernel backend: the scratch pod tree, the probe and burner processes in it, and readings.

The probes and burners are child processes (`koordqos.demo.workload`) moved into their container cgroups
right after they start; they exit when the demo closes their stdin, so none outlives it. The agent's cgroup
root is a directory of empty mount points; `nsexec` bind-mounts the scratch dirs there in the agent's own
mount namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from koordqos.cgroups.resources import CgroupVersion
from koordqos.demo.agentproc import AgentSpec
from koordqos.demo.cgtree import PodTree, detect_version, sweep_stale
from koordqos.demo.exitguard import ExitGuard
from koordqos.demo.workload import BurnArgs, ProbeArgs


class RealNode:
    """Workload and readings on the real kernel (see the module docstring)."""

    kind = "real"

    def __init__(self, workdir: Path, guard: ExitGuard, root_shares: int | None = None) -> None:
        self.workdir = workdir
        self.guard = guard
        self.root_shares = root_shares
        version = detect_version()
        self.tree = PodTree(version=version or CgroupVersion.V1)
        self.cpu_ids = sorted(os.sched_getaffinity(0))
        self.cpus = len(self.cpu_ids)
        self._probes: list[asyncio.subprocess.Process] = []
        self._burners: list[asyncio.subprocess.Process] = []
        self._readers: list[asyncio.Task[None]] = []
        self._samples: list[int] = []

    @property
    def cgroup_version(self) -> str:
        """ "v1" or "v2"."""
        return str(self.tree.version)

    def setup(self, ls_request_milli: int) -> None:
        """Remove the trees of demos that were killed, then create the scratch tree (removed by the exit
        guard) and the agent's mount points."""
        for name in sweep_stale(self.tree.root, self.tree.version):
            print(f"removed stale scratch cgroups {name} (its demo process is gone)")
        self.guard.push(f"remove scratch cgroups {self.tree.name}", self.tree.cleanup)
        self.tree.create(self.cpus, ls_request_milli, self.root_shares)
        before = self.tree.enter(self.tree.demo_dir)
        self.guard.push("move the demo out of the scratch tree", lambda: self.tree.leave(before))
        for name in self.tree.mount_sources():
            (self.workdir / "cgroup" / name).mkdir(parents=True, exist_ok=True)

    def pin_demo(self, cpus: list[int]) -> None:
        """Pin this process (and so what it starts: the agent) to `cpus`; undone by the exit guard."""
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
        self.guard.push("unpin the demo", lambda: os.sched_setaffinity(0, before))

    async def _spawn(self, rel: str, *args: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "koordqos.demo.workload",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.guard.push(f"stop workload pid {proc.pid}", lambda: _kill(proc))
        self.tree.add_process(rel, proc.pid)
        return proc

    async def start_probes(self, count: int, probe: ProbeArgs) -> None:
        """Start the LS probes in the LS container."""
        for _ in range(count):
            proc = await self._spawn(self.tree.ls_container_dir, *probe.argv())
            self._probes.append(proc)
            self._readers.append(asyncio.create_task(self._read(proc)))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            parts = line.split()
            self._samples.extend(int(p) for p in parts[1:])

    def drain_latencies(self) -> list[int]:
        """Latency samples (µs) reported since the previous call."""
        out, self._samples = self._samples, []
        return out

    async def start_burners(self, count: int, burn: BurnArgs | None = None) -> None:
        """Start the BE processes in the BE container (CPU spinners by default)."""
        argv = (burn or BurnArgs(mode="spin")).argv()
        for _ in range(count):
            self._burners.append(await self._spawn(self.tree.be_container_dir, *argv))

    async def stop_burners(self) -> None:
        """Stop the BE burners."""
        for proc in self._burners:
            _kill(proc)
            await proc.wait()
        self._burners.clear()

    async def stop(self) -> None:
        """Stop every workload process."""
        await self.stop_burners()
        for proc in self._probes:
            _kill(proc)
            await proc.wait()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        self._probes.clear()

    async def tick(self) -> None:
        """Nothing to simulate on a real kernel."""

    def read(self) -> tuple[float, float, int]:
        """(LS pod CPU seconds, BE QoS dir CPU seconds, besteffort quota)."""
        tree = self.tree
        return (
            tree.cpu_usage_seconds(tree.ls_pod_dir),
            tree.cpu_usage_seconds(tree.be_qos_dir),
            tree.be_quota(),
        )

    def ls_cpu_stall_us(self) -> int | None:
        """The LS pod's cumulative CPU "some" stall (µs, the kernel's PSI total); None where its cgroup has
        no pressure file (plain cgroup v1)."""
        path = self.tree.pressure_file(self.tree.ls_pod_dir)
        if path is None:
            return None
        try:
            first = path.read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first.rsplit("total=", 1)[1]) if "total=" in first else None

    def set_be_quota(self, quota: int) -> None:
        """Set the besteffort quota by hand."""
        self.tree.set_be_quota(quota)

    def agent_spec(self, interval: float, name: str = "agent", extra_args: Sequence[str] = ()) -> AgentSpec:
        """The agent in `<scratch>/system`, its cgroup root the bind-mounted scratch tree (`name` keeps the
        socket, NodeSLO file and log of several agents apart)."""
        launcher = [sys.executable, "-m", "koordqos.demo.nsexec"]
        for procs in self.tree.procs_files(self.tree.system_dir):
            launcher += ["--join", str(procs)]
        for controller, src in self.tree.mount_sources().items():
            launcher += ["--bind", str(src), str(self.workdir / "cgroup" / controller)]
        launcher.append("--")
        return AgentSpec(
            cgroup_root=self.workdir / "cgroup",
            nri_socket=self.workdir / f"{name}-nri.sock",
            nodeslo_file=self.workdir / f"{name}-nodeslo.json",
            log_file=self.workdir / f"{name}.log",
            interval=interval,
            launcher=launcher,
            extra_args=tuple(extra_args),
        )

    def scratch_left(self) -> bool:
        """Whether any scratch cgroup dir still exists."""
        return self.tree.exists()


def _kill(proc: asyncio.subprocess.Process) -> None:
    # os.kill, not proc.kill(): the exit guard may run this after the event loop is gone
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
