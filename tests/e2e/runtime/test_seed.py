"""The seed scenario on the real runtime: crictl → containerd → NRI → koordqos → runc → kernel cgroups.

A BE pod with batch resources (koordinator's `node.koordinator.sh/extended-resource-spec` annotation, which
is what a pod seen only through NRI carries) gets `cpu.cfs_quota_us`, `cpu.shares` and
`memory.limit_in_bytes` from them, in its pod cgroup and in its running container's cgroup. The values
asked through the CRI are the kubelet's BestEffort ones (shares 2, no quota, no memory limit), so without
koordqos connected every assertion below fails. The local-mode test and its control run in both cgroup
views (cgview.py): this machine's separate mounts and systemd's `cpu -> cpu,cpuacct` layout, where the pod
cgroup's values can only come from the agent writing through the link (runc applies the container's).
"""

from __future__ import annotations

import json

import pytest

from koordqos.testing.poll import wait_until_sync

from .cgview import LAYOUTS
from .cri import BE_RESOURCES, SLEEP, PodSpec
from .prereq import POLL
from .stack import Stack, wait_reading

pytestmark = pytest.mark.e2e_runtime
MI = 1 << 20
EXT_SPEC = "node.koordinator.sh/extended-resource-spec"
UNLIMITED = 9223372036854771712  # memory.limit_in_bytes with no limit (page-rounded LONG_MAX)


def be_pod(name: str, cpu_req: int = 1500, cpu_lim: int = 2000, mem: int = 256 * MI) -> PodSpec:
    """A BE pod whose container `main` has batch-cpu request/limit (milli) and batch-memory."""
    spec = {
        "containers": {
            "main": {
                "requests": {"kubernetes.io/batch-cpu": str(cpu_req), "kubernetes.io/batch-memory": str(mem)},
                "limits": {"kubernetes.io/batch-cpu": str(cpu_lim), "kubernetes.io/batch-memory": str(mem)},
            }
        }
    }
    return PodSpec(
        name,
        "besteffort",
        labels={"koordinator.sh/qosClass": "BE"},
        annotations={EXT_SPEC: json.dumps(spec)},
    )


def batch_values(rt: Stack, rel: str) -> tuple[int, int, int]:
    """(cfs quota, shares, memory limit) of a real cgroup dir of the scratch tree."""
    return (
        int(rt.tree.read("cpu", rel, "cpu.cfs_quota_us")),
        int(rt.tree.read("cpu", rel, "cpu.shares")),
        int(rt.tree.read("memory", rel, "memory.limit_in_bytes")),
    )


@pytest.mark.parametrize("rt", LAYOUTS, indirect=True)
def test_be_pod_gets_batch_limits_in_real_cgroups(rt: Stack) -> None:
    agent = rt.agent()
    agent.start()
    agent.wait_connected()
    assert agent.metric("koordqos_nri_connected") == 1.0

    pod = be_pod("seed")
    rt.cri.run_pod(pod)
    cid = rt.cri.run_container(pod, "main", SLEEP, **BE_RESOURCES)

    # the running container's own cgroup, read from the kernel
    ctr_dir = pod.container_dir("main")
    assert batch_values(rt, ctr_dir) == (200000, 1536, 256 * MI)
    assert batch_values(rt, ctr_dir) != (2, -1, UNLIMITED)  # not what containerd alone sets (see test below)
    pid = rt.cri.pid(cid)
    assert str(pid) in rt.tree.read("cpu", ctr_dir, "cgroup.procs").split()  # it is the live container's

    # the pod cgroup: written by the agent at RunPodSandbox (and kept by the reconciler)
    wait_reading(
        lambda: batch_values(rt, pod.cgroup_dir),
        lambda v: v == (200000, 1536, 256 * MI),
        20,
        "pod-level batch limits (cfs quota, shares, memory limit)",
    )

    # the agent saw it all through NRI
    state = agent.state()
    pods = {p["uid"]: p for p in state["pods"]}
    assert pods[pod.uid]["qos"] == "BE"
    assert agent.metric("koordqos_nri_requests_total", method="CreateContainer") >= 1


@pytest.mark.parametrize("rt", LAYOUTS, indirect=True)
def test_without_koordqos_the_same_pod_gets_plain_values(rt: Stack) -> None:
    """The control: what containerd and runc alone make of the same request (no agent connected)."""
    pod = be_pod("control")
    rt.cri.run_pod(pod)
    rt.cri.run_container(pod, "main", SLEEP, **BE_RESOURCES)
    assert batch_values(rt, pod.container_dir("main")) == (-1, 2, UNLIMITED)


def test_cluster_mode_be_pod_from_the_api_gets_batch_limits(rt: Stack) -> None:
    """Cluster mode: the pod object (batch resources in its spec, no annotation) comes from the fake API
    server; the sandbox and container come from crictl; the same cgroup values must follow."""
    from tests.support.fake_apiserver import make_node, make_pod

    from .agentproc import ThreadedAPIServer

    pod = PodSpec("cluster-seed", "besteffort", labels={"koordinator.sh/qosClass": "BE"})
    raw = make_pod(
        pod.name,
        "e2e-node",
        namespace="e2e",
        uid=pod.uid,
        qos="BE",
        requests={"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": str(256 * MI)},
        limits={"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": str(256 * MI)},
    )
    with ThreadedAPIServer() as api:
        api.upsert("nodes", make_node("e2e-node"))
        api.upsert("pods", raw)
        agent = rt.agent("--kubeconfig", str(api.kubeconfig(rt.workdir / "kubeconfig")))
        agent.start()
        agent.wait_connected()
        wait_until_sync(
            lambda: agent.readyz().get("ready") is True, 60, POLL, "the agent to sync pods, Node and NodeSLO"
        )
        assert agent.readyz()["mode"] == "cluster"
        rt.cri.run_pod(pod)
        rt.cri.run_container(pod, "main", SLEEP, **BE_RESOURCES)
        assert batch_values(rt, pod.container_dir("main")) == (200000, 1536, 256 * MI)
        wait_until_sync(
            lambda: batch_values(rt, pod.cgroup_dir) == (200000, 1536, 256 * MI),
            20,
            POLL,
            "pod-level batch limits",
        )
        agent.stop()
