"""The synthetic backend (`--synthetic`): the same flow on a synthetic node, with simulated usage.

A `SyntheticNode` directory stands in for /sys/fs/cgroup, /proc and /sys. Every tick the driver advances
the counters the agent reads: the LS pod uses what the probes would (`probes × work / period` cores), the
BE pod what its burners want, limited by the besteffort quota the agent writes and by what the node has
left, plus a small system load; /proc/stat gets the sum as busy time. No process runs and nothing is
measured for latency: this mode shows the agent's decisions, not their effect.
"""

from __future__ import annotations

import time
from pathlib import Path

from koordqos.demo.agentproc import AgentSpec
from koordqos.demo.cgtree import BE_CONTAINER, BE_UID, CFS_PERIOD, LS_CONTAINER, LS_UID
from koordqos.demo.workload import BurnArgs, ProbeArgs
from koordqos.testing.nodefs import SyntheticNode

SYSTEM_CORES = 0.1
USER_HZ = 100
LS_POD = f"kubepods/burstable/pod{LS_UID}"
BE_POD = f"kubepods/besteffort/pod{BE_UID}"
BE_QOS = "kubepods/besteffort"


class SyntheticBackend:
    """Simulated usage on a synthetic node (see the module docstring)."""

    kind = "synthetic"
    cgroup_version = "v1"

    def __init__(self, workdir: Path, cpus: int, work_ms: float, period_ms: float) -> None:
        self.workdir = workdir
        self.cpus = cpus
        self.cpu_ids = list(range(cpus))
        self.node = SyntheticNode(workdir / "node", cpus=cpus)
        self.per_probe = work_ms / period_ms
        self.probes = 0
        self.burners = 0
        self._last = time.monotonic()
        self._carry = [0.0, 0.0]  # fractional USER_HZ ticks (busy, idle) not yet written
        self._ls_s = 0.0
        self._be_s = 0.0
        self._last_quota = -1

    def setup(self, ls_request_milli: int) -> None:
        """Create the pod and container dirs."""
        del ls_request_milli
        for rel in (LS_POD, f"{LS_POD}/{LS_CONTAINER}", BE_POD, f"{BE_POD}/{BE_CONTAINER}"):
            self.node.make_cgroup(rel)

    def pin_demo(self, cpus: list[int]) -> None:
        """Nothing to pin: the simulated pods share the node's CPUs."""

    async def start_probes(self, count: int, probe: ProbeArgs) -> None:
        """Simulate `count` probes from now on."""
        del probe
        await self.tick()
        self.probes = count

    def drain_latencies(self) -> list[int]:
        """No latency in a simulation."""
        return []

    async def start_burners(self, count: int, burn: BurnArgs | None = None) -> None:
        """Simulate `count` burners from now on (each wants a core, whatever its mode)."""
        del burn
        await self.tick()
        self.burners = count

    async def stop_burners(self) -> None:
        """No more burners."""
        await self.tick()
        self.burners = 0

    async def stop(self) -> None:
        """Nothing runs."""
        await self.stop_burners()
        self.probes = 0

    def _quota(self) -> int:
        # the agent rewrites the file in place: a read can catch it empty, then the previous value holds
        try:
            self._last_quota = int(self.node.read(BE_QOS, "cpu", "cpu.cfs_quota_us"))
        except ValueError:
            pass
        return self._last_quota

    async def tick(self) -> None:
        """Advance every counter by what was used since the previous tick."""
        self._advance()

    def _advance(self) -> None:
        now = time.monotonic()
        dt, self._last = now - self._last, now
        ls = min(self.probes * self.per_probe, float(self.cpus))
        quota = self._quota()
        be_cap = quota / CFS_PERIOD if quota > 0 else float("inf")
        be = max(0.0, min(float(self.burners), be_cap, self.cpus - ls - SYSTEM_CORES))
        self._ls_s += ls * dt
        self._be_s += be * dt
        for rel in (LS_POD, f"{LS_POD}/{LS_CONTAINER}", "kubepods/burstable"):
            self.node.add_cpu_usage(rel, int(ls * dt * 1e9))
        for rel in (BE_POD, f"{BE_POD}/{BE_CONTAINER}", BE_QOS):
            self.node.add_cpu_usage(rel, int(be * dt * 1e9))
        busy = ls + be + SYSTEM_CORES
        self._carry[0] += busy * dt * USER_HZ
        self._carry[1] += (self.cpus - busy) * dt * USER_HZ
        b, i = int(self._carry[0]), int(self._carry[1])
        self._carry[0] -= b
        self._carry[1] -= i
        self.node.advance_node_cpu(b, i)

    def read(self) -> tuple[float, float, int]:
        """(LS CPU seconds, BE CPU seconds, besteffort quota), usage integrated up to now."""
        self._advance()
        return self._ls_s, self._be_s, self._quota()

    def set_be_quota(self, quota: int) -> None:
        """Set the besteffort quota by hand."""
        self.node.write(BE_QOS, "cpu", "cpu.cfs_quota_us", quota)

    def agent_spec(self, interval: float) -> AgentSpec:
        """The agent on the synthetic node's roots."""
        return AgentSpec(
            cgroup_root=self.node.cgroup_root,
            proc_root=self.node.proc_root,
            sys_root=self.node.sys_root,
            nri_socket=self.workdir / "nri.sock",
            nodeslo_file=self.workdir / "nodeslo.json",
            log_file=self.workdir / "agent.log",
            interval=interval,
        )

    def scratch_left(self) -> bool:
        """No real cgroup is made."""
        return False
