"""CPU suppress on the real kernel: a BE pod's burner container is throttled through the besteffort cgroup.

NodeSLO (the agent's --nodeslo-file) enables suppress with the cfsQuota policy and a 10 % threshold: on a
2-CPU node whatever else runs leaves BE little or nothing, so the agent caps kubepods/besteffort's CFS quota
(the parent of the BE pod's cgroup) and the kernel throttles the burner: its throttle counter grows and
its CPU rate stays under the quota.
"""

from __future__ import annotations

import os
import time

import pytest

from koordqos.testing.poll import wait_until_sync

from .cri import BE_RESOURCES, BURN
from .prereq import POLL
from .stack import Stack
from .test_seed import be_pod

pytestmark = pytest.mark.e2e_runtime
PERIOD = 100000
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


def throttled(rt: Stack, rel: str) -> int:
    stat = dict(line.split() for line in rt.tree.read("cpu", rel, "cpu.stat").splitlines())
    return int(stat["nr_throttled"])


def test_cpu_suppress_throttles_the_real_be_burner(rt: Stack) -> None:
    be_dir = "kubepods/besteffort"
    assert rt.tree.read("cpu", be_dir, "cpu.cfs_quota_us") == "-1"  # unsuppressed to begin with
    agent = rt.agent(nodeslo=NODESLO_SUPPRESS)
    agent.start()
    agent.wait_connected()
    pod = be_pod("burner")
    rt.cri.run_pod(pod)
    rt.cri.run_container(pod, "burn", BURN, **BE_RESOURCES)
    ctr = pod.container_dir("burn")

    cpus = os.cpu_count() or 1
    ceiling = cpus * PERIOD * 10 // 100  # capacity × threshold: the most BE may get
    wait_until_sync(
        lambda: int(rt.tree.read("cpu", be_dir, "cpu.cfs_quota_us")) > 0,
        60,
        POLL,
        "the agent to cap the besteffort CFS quota",
    )
    quota = int(rt.tree.read("cpu", be_dir, "cpu.cfs_quota_us"))
    assert 0 < quota <= ceiling

    # the kernel enforces it: the besteffort group (the burner's pod's parent) keeps hitting its quota
    t0, used0, thr0 = (
        time.monotonic(),
        int(rt.tree.read("cpuacct", ctr, "cpuacct.usage")),
        throttled(rt, be_dir),
    )
    wait_until_sync(
        lambda: throttled(rt, be_dir) >= thr0 + 10, 30, POLL, "the besteffort group to be throttled"
    )
    elapsed = time.monotonic() - t0
    rate = (int(rt.tree.read("cpuacct", ctr, "cpuacct.usage")) - used0) / 1e9 / elapsed  # cores
    quota_now = int(rt.tree.read("cpu", be_dir, "cpu.cfs_quota_us"))
    assert 0 < quota_now <= ceiling
    assert rate <= quota_now / PERIOD * 1.5 + 0.05, f"burner used {rate:.3f} cores under {quota_now}"
    assert agent.state()["node_slo"] is not None
