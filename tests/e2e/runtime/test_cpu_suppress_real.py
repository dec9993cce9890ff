"""CPU suppress and the pod CPU reading on the real kernel, with a BE pod's burner container running.

NodeSLO (the agent's --nodeslo-file) enables suppress with the cfsQuota policy and a 10 % threshold: on a
2-CPU node whatever else runs leaves BE little or nothing, so the agent caps kubepods/besteffort's CFS quota
(the parent of the BE pod's cgroup) and the kernel throttles the burner: its throttle counter grows and
its CPU rate stays under the quota. The agent's collector reads the burner pod's CPU from its cgroup's
`cpuacct.usage` every round; what it reports must match the rate the host measures in the same cgroup.

Both tests share one stack per cgroup view (cgview.py: `separate`, and systemd's `cpu -> cpu,cpuacct`
layout), so the burner pod is started once per layout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from koordqos.testing.poll import wait_until_sync

from .agentproc import Agent
from .cgview import LAYOUTS, Layout
from .conftest import toolchain
from .cri import BE_RESOURCES, BURN, PodSpec
from .prereq import POLL
from .stack import Stack, stack, wait_reading
from .test_seed import be_pod

pytestmark = pytest.mark.e2e_runtime
PERIOD = 100000
BE_DIR = "kubepods/besteffort"
NODESLO_SUPPRESS = {
    "apiVersion": "slo.koordinator.sh/v1alpha1",
    "kind": "NodeSLO",
    "metadata": {"name": "e2e-node"},
    "spec": {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressThresholdPercent": 10,
            "cpuSuppressPolicy": "cfsQuota",
        }
    },
}


@dataclass
class Burner:
    rt: Stack
    agent: Agent
    pod: PodSpec


@pytest.fixture(scope="module", params=LAYOUTS)
def burner(request: pytest.FixtureRequest) -> Iterator[Burner]:
    """One stack per layout: the agent with suppress on, then a BE pod whose container `burn` busy-loops."""
    layout: Layout = request.param
    with stack(toolchain(), layout) as rt:
        assert rt.tree.read("cpu", BE_DIR, "cpu.cfs_quota_us") == "-1"  # unsuppressed to begin with
        agent = rt.agent(nodeslo=NODESLO_SUPPRESS)
        agent.start()
        agent.wait_connected()
        pod = be_pod("burner")
        rt.cri.run_pod(pod)
        rt.cri.run_container(pod, "burn", BURN, **BE_RESOURCES)
        yield Burner(rt, agent, pod)


def throttled(rt: Stack, rel: str) -> int:
    stat = dict(line.split() for line in rt.tree.read("cpu", rel, "cpu.stat").splitlines())
    return int(stat["nr_throttled"])


def test_cpu_suppress_throttles_the_real_be_burner(burner: Burner) -> None:
    rt, agent = burner.rt, burner.agent
    ctr = burner.pod.container_dir("burn")

    cpus = os.cpu_count() or 1
    ceiling = cpus * PERIOD * 10 // 100  # capacity × threshold: the most BE may get
    quota = wait_reading(
        lambda: int(rt.tree.read("cpu", BE_DIR, "cpu.cfs_quota_us")),
        lambda q: q > 0,
        60,
        "the agent to cap the besteffort CFS quota",
    )
    assert 0 < quota <= ceiling

    # the kernel enforces it: the besteffort group (the burner's pod's parent) keeps hitting its quota
    t0, used0, thr0 = (
        time.monotonic(),
        int(rt.tree.read("cpuacct", ctr, "cpuacct.usage")),
        throttled(rt, BE_DIR),
    )
    wait_until_sync(
        lambda: throttled(rt, BE_DIR) >= thr0 + 10, 30, POLL, "the besteffort group to be throttled"
    )
    elapsed = time.monotonic() - t0
    rate = (int(rt.tree.read("cpuacct", ctr, "cpuacct.usage")) - used0) / 1e9 / elapsed  # cores
    quota_now = int(rt.tree.read("cpu", BE_DIR, "cpu.cfs_quota_us"))
    assert 0 < quota_now <= ceiling
    assert rate <= quota_now / PERIOD * 1.5 + 0.05, f"burner used {rate:.3f} cores under {quota_now}"
    assert agent.state()["node_slo"] is not None


def test_agent_reads_the_running_burner_pods_cpu(burner: Burner) -> None:
    """The pod's `cpu_usage_cores` in /debug/state's last_metrics (the collector's snapshot, one per round)
    is > 0 and, averaged over a window of rounds, within 25 % (+0.05 cores) of the rate of the same pod
    cgroup's cpuacct.usage the host reads over that window."""
    rt, agent, pod = burner.rt, burner.agent, burner.pod

    def reading() -> tuple[float, float | None]:
        """(the round's time, the pod's cores in it: None while the pod has no sample or no CPU rate)"""
        snap = agent.state()["last_metrics"] or {}
        sample = (snap.get("pods") or {}).get(pod.uid) or {}
        return float(snap.get("at") or 0.0), sample.get("cpu_usage_cores")

    wait_reading(reading, lambda r: (r[1] or 0.0) > 0, 30, "the agent to report the burner pod's CPU usage")

    interval = 1.0  # --collect-interval's default: a round's rate covers the second before its `at`
    t0, used0 = time.time(), int(rt.tree.read("cpuacct", pod.cgroup_dir, "cpuacct.usage"))
    rounds: dict[float, float] = {}

    def enough_rounds() -> bool:
        at, cores = reading()
        if cores is not None and at - interval >= t0:
            rounds[at] = cores
        return len(rounds) >= 4

    wait_until_sync(enough_rounds, 30, POLL, "four collect rounds of the burner pod")
    t1, used1 = time.time(), int(rt.tree.read("cpuacct", pod.cgroup_dir, "cpuacct.usage"))
    real = (used1 - used0) / 1e9 / (t1 - t0)
    reported = sum(rounds.values()) / len(rounds)
    assert real > 0.01, f"the burner pod used {real:.3f} cores: not running?"
    assert min(rounds.values()) > 0, f"the agent reported no CPU in a round: {rounds}"
    assert abs(reported - real) <= 0.25 * real + 0.05, (
        f"the agent reported {reported:.3f} cores (rounds {sorted(rounds.items())}), the host measured "
        f"{real:.3f} over the same {t1 - t0:.1f} s"
    )
