"""Runtime hooks on the real runtime: LSR cpuset, group identity (cpu.idle), oom_score_adj, UpdateContainer.

Each value is read from the kernel (cgroup files, /proc/<pid>) of a running container created through crictl;
the CRI request carries the kubelet's values, so each assertion fails without koordqos connected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from koordqos.testing.poll import wait_until_sync

from .cri import BE_RESOURCES, SLEEP, PodSpec
from .prereq import POLL
from .stack import Stack
from .test_seed import MI, batch_values, be_pod

pytestmark = pytest.mark.e2e_runtime

# groupIdentity per class, as koordlet's defaults have it when cpuQOS is enabled (BE -1: offline)
NODESLO_CPU_QOS = {
    "apiVersion": "slo.koordinator.sh/v1alpha1",
    "kind": "NodeSLO",
    "metadata": {"name": "e2e-node"},
    "spec": {
        "resourceQOSStrategy": {
            "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
            "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
            "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
        }
    },
}


def test_lsr_pod_is_pinned_to_its_cpuset(rt: Stack) -> None:
    agent = rt.agent()
    agent.start()
    agent.wait_connected()
    cpus = rt.tree.read("cpuset", "", "cpuset.cpus")
    last = cpus.replace("-", ",").split(",")[-1]  # the node's last cpu: a cpuset the scheduler could pick
    pod = PodSpec(
        "lsr",
        "guaranteed",
        labels={"koordinator.sh/qosClass": "LSR"},
        annotations={"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": last})},
    )
    rt.cri.run_pod(pod)
    # a Guaranteed container as the kubelet asks for it: 1 cpu (shares 1024, quota 100000), 64 MiB
    rt.cri.run_container(
        pod,
        "main",
        SLEEP,
        cpu_shares=1024,
        cpu_period=100000,
        cpu_quota=100000,
        memory_limit_in_bytes=64 * MI,
    )
    ctr = pod.container_dir("main")
    assert rt.tree.read("cpuset", ctr, "cpuset.cpus") == last
    assert rt.tree.read("cpu", ctr, "cpu.cfs_quota_us") == "-1"  # pinned pods are not CFS-throttled
    assert rt.tree.read("cpu", ctr, "cpu.shares") == "1024"  # what the kubelet asked stays


def test_group_identity_and_oom_score_adj(rt: Stack) -> None:
    agent = rt.agent("--feature-gates", "OOMScoreAdj=true", nodeslo=NODESLO_CPU_QOS)
    agent.start()
    agent.wait_connected()
    pod = be_pod("gi")
    pod.annotations["koordinator.sh/oom-score-adj"] = "500"
    rt.cri.run_pod(pod)
    cid = rt.cri.run_container(pod, "main", SLEEP, oom_score_adj=1000, **BE_RESOURCES)
    pid = rt.cri.pid(cid)
    # the kubelet asked 1000 for the BE container; the annotation's 500 came in the NRI adjustment
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "500"
    # group identity: this kernel has no Anolis cpu.bvt_warp_ns; the agent uses cpu.idle for BE (-1)
    if not rt.tree.real("cpu", "kubepods").joinpath("cpu.idle").exists():
        pytest.skip("the kernel has neither cpu.bvt_warp_ns nor cpu.idle: no group identity to check")
    assert not rt.tree.real("cpu", "kubepods").joinpath("cpu.bvt_warp_ns").exists()
    wait_until_sync(
        lambda: rt.tree.read("cpu", pod.cgroup_dir, "cpu.idle") == "1", 20, POLL, "BE pod cpu.idle=1"
    )


def test_update_container_keeps_batch_limits(rt: Stack) -> None:
    agent = rt.agent()
    agent.start()
    agent.wait_connected()
    pod = be_pod("upd")
    rt.cri.run_pod(pod)
    cid = rt.cri.run_container(pod, "main", SLEEP, **BE_RESOURCES)
    ctr = pod.container_dir("main")
    assert batch_values(rt, ctr) == (200000, 1536, 256 * MI)
    before = agent.metric("koordqos_nri_requests_total", method="UpdateContainer")
    # what a kubelet resize of a BE container sends: the minimum shares, no quota
    rt.cri.update(cid, "--cpu-share", "2", "--cpu-quota", "-1")
    assert agent.metric("koordqos_nri_requests_total", method="UpdateContainer") == before + 1
    assert batch_values(rt, ctr) == (200000, 1536, 256 * MI)  # the agent's reply won over the request
    # and containerd recorded the merged resources as the container's own
    res = rt.cri.inspect(cid)["status"]["resources"]["linux"]
    assert (int(res["cpuShares"]), int(res["cpuQuota"])) == (1536, 200000)
