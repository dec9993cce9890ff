"""The same pod through NRI (mock runtime on a unix socket) and through proxy mode (grpclib client on the
RuntimeHookService socket) ends with the same cgroup values: pod files written by the agent, container files
as the runtime writes them from the agent's answer (NRI adjustment / proxy response)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level
from koordqos.cgroups.resources import CgroupVersion, get_resource, render, same_value
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.testing.poll import wait_until

from .conftest import GI, AgentEnv, PodSpec, be_pod, container_request, lsr_pod, pod_request, running_agent


@dataclass(frozen=True)
class Kubelet:
    """What the kubelet asks the runtime for (0 / "" = not specified)."""

    shares: int
    quota: int
    memory: int
    cpuset: str = ""


def ls_pod(uid: str = "ls-0001") -> PodSpec:
    return PodSpec(uid, "LS", f"/kubepods/burstable/pod{uid}", {})


INHERIT = "inherit"  # the runtime leaves the file as the new cgroup got it (inherited from the parent)

# case → (pod, kubelet's container request, kubelet's pod-level values written before RunPodSandbox)
CASES: dict[str, tuple[PodSpec, Kubelet, dict[str, int]]] = {
    "be-batch": (
        be_pod("be-0001", cpu_limit=2000, mem="4Gi", cpu_request=1500),
        Kubelet(2, -1, 0),
        {"cpu.shares": 2, "cpu.cfs_quota_us": -1, "memory.limit_in_bytes": -1},
    ),
    "lsr-pinned": (
        lsr_pod("lsr-0001", cpuset="2-3"),
        Kubelet(2048, 200000, 4 * GI, "0-3"),
        {"cpu.shares": 2048, "cpu.cfs_quota_us": 200000, "memory.limit_in_bytes": 4 * GI},
    ),
    "ls-plain": (
        ls_pod(),
        Kubelet(1024, 100000, 2 * GI),
        {"cpu.shares": 1024, "cpu.cfs_quota_us": 100000, "memory.limit_in_bytes": 2 * GI},
    ),
}

# (level, resource) → logical value after RunPodSandbox + CreateContainer
EXPECTED: dict[str, dict[tuple[str, str], int | str]] = {
    "be-batch": {
        ("pod", "cpu.shares"): 1536,
        ("pod", "cpu.cfs_quota_us"): 200000,
        ("pod", "memory.limit_in_bytes"): 4 * GI,
        ("container", "cpu.shares"): 1536,
        ("container", "cpu.cfs_quota_us"): 200000,
        ("container", "memory.limit_in_bytes"): 4 * GI,
        ("container", "cpuset.cpus"): INHERIT,  # BestEffort: cleared, so inherited
    },
    "lsr-pinned": {
        ("pod", "cpu.shares"): 2048,
        ("pod", "cpu.cfs_quota_us"): -1,  # pinned pods are not throttled
        ("pod", "memory.limit_in_bytes"): 4 * GI,
        ("container", "cpu.shares"): 2048,
        ("container", "cpu.cfs_quota_us"): -1,
        ("container", "memory.limit_in_bytes"): 4 * GI,
        ("container", "cpuset.cpus"): "2-3",
    },
    "ls-plain": {
        ("pod", "cpu.shares"): 1024,
        ("pod", "cpu.cfs_quota_us"): 100000,
        ("pod", "memory.limit_in_bytes"): 2 * GI,
        ("container", "cpu.shares"): 1024,
        ("container", "cpu.cfs_quota_us"): 100000,
        ("container", "memory.limit_in_bytes"): 2 * GI,
        ("container", "cpuset.cpus"): INHERIT,
    },
}


@dataclass
class Answer:
    """The container values the agent answered (None / "" = not set)."""

    shares: int | None
    quota: int | None
    memory: int | None
    cpuset: str


def nri_sandbox(pod: PodSpec) -> api.PodSandbox:
    sb = api.PodSandbox(
        id=f"sb-{pod.uid}",
        name=f"pod-{pod.uid}",
        uid=pod.uid,
        namespace="default",
        labels={"koordinator.sh/qosClass": pod.qos},
        annotations=pod.annotations,
    )
    sb.linux.cgroup_parent = pod.cgroup_parent
    return sb


def nri_container(sb: api.PodSandbox, cid: str, kubelet: Kubelet) -> api.Container:
    ctr = api.Container(id=cid, pod_sandbox_id=sb.id, name="main", state=api.CONTAINER_CREATED, env=["A=1"])
    res = ctr.linux.resources
    res.cpu.shares.value = kubelet.shares
    res.cpu.quota.value = kubelet.quota
    if kubelet.memory:
        res.memory.limit.value = kubelet.memory
    res.cpu.cpus = kubelet.cpuset
    ctr.linux.cgroups_path = f"{sb.linux.cgroup_parent}/{cid}"
    return ctr


async def via_nri(env: AgentEnv, pod: PodSpec, cid: str, kubelet: Kubelet) -> Answer:
    assert env.runtime is not None
    sb = nri_sandbox(pod)
    await env.runtime.run_pod_sandbox(sb)
    resp = await env.runtime.create_container(sb, nri_container(sb, cid, kubelet))
    assert resp is not None
    res = resp.adjust.linux.resources
    return Answer(
        int(res.cpu.shares.value) if res.cpu.HasField("shares") else None,
        res.cpu.quota.value if res.cpu.HasField("quota") else None,
        res.memory.limit.value if res.memory.HasField("limit") else None,
        res.cpu.cpus,
    )


async def via_proxy(env: AgentEnv, pod: PodSpec, kubelet: Kubelet) -> Answer:
    assert env.stub is not None
    sandbox = await env.stub.PreRunPodSandboxHook(pod_request(pod))
    assert sandbox is not None
    asked = rpb.LinuxContainerResources(
        cpu_shares=kubelet.shares,
        cpu_quota=kubelet.quota,
        memory_limit_in_bytes=kubelet.memory,
        cpuset_cpus=kubelet.cpuset,
    )
    resp = await env.stub.PreCreateContainerHook(container_request(pod, resources=asked))
    assert resp is not None
    # the proxy merges the response into the CRI request: 0 / "" mean "not specified"
    res = resp.container_resources
    return Answer(
        res.cpu_shares or None, res.cpu_quota or None, res.memory_limit_in_bytes or None, res.cpuset_cpus
    )


async def runtime_applies(executor: CgroupExecutor, cdir: str, kubelet: Kubelet, answer: Answer) -> None:
    """What the runtime writes for the new container: the agent's fields over the kubelet's."""
    shares = answer.shares if answer.shares is not None else kubelet.shares
    quota = answer.quota if answer.quota is not None else kubelet.quota
    memory = answer.memory if answer.memory is not None else kubelet.memory
    cpuset = answer.cpuset or kubelet.cpuset
    writes = [
        CgroupWrite(cdir, "cpu.shares", shares, Level.CONTAINER, cacheable=False),
        CgroupWrite(cdir, "cpu.cfs_quota_us", quota, Level.CONTAINER, cacheable=False),
    ]
    if memory:
        writes.append(CgroupWrite(cdir, "memory.limit_in_bytes", memory, Level.CONTAINER, cacheable=False))
    if cpuset and cpuset != "0-3":  # the kubelet's full set is the inherited value already
        writes.append(CgroupWrite(cdir, "cpuset.cpus", cpuset, Level.CONTAINER, cacheable=False))
    results = await executor.apply_sequential("test-runtime", writes)
    assert all(r.ok for r in results), results


@pytest.mark.parametrize("version", [CgroupVersion.V1, CgroupVersion.V2], ids=["v1", "v2"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["nri", "proxy"])
async def test_same_pod_same_cgroup_values_in_nri_and_proxy_mode(
    mode: str, case: str, version: CgroupVersion, short_dir: Path
) -> None:
    pod, kubelet, pod_values = CASES[case]
    async with running_agent(short_dir, version, nri=mode == "nri", proxy=mode == "proxy") as env:
        node = env.node
        executor: CgroupExecutor = env.agent.services.executor
        pod_dir = node.layout.normalize_parent(pod.cgroup_parent)
        node.make_cgroup(pod_dir)  # the kubelet creates the pod cgroup before RunPodSandbox
        kubelet_writes = [
            CgroupWrite(pod_dir, r, v, Level.POD, cacheable=False) for r, v in pod_values.items()
        ]
        assert all(w.ok for w in await executor.apply_sequential("test-kubelet", kubelet_writes))
        cid = f"c{case.replace('-', '')[:8]}0001"
        if mode == "nri":
            answer = await via_nri(env, pod, cid, kubelet)
        else:
            answer = await via_proxy(env, pod, kubelet)
        cdir = node.layout.container_dir_in(pod_dir, f"containerd://{cid}")
        node.make_cgroup(cdir)
        inherited = executor.read(cdir, "cpuset.cpus")
        await runtime_applies(executor, cdir, kubelet, answer)
        # The agent's reconciler (every 0.1 s) may be writing the same files right now (a memory limit in a
        # worker thread): on the synthetic node's plain files a read between its truncate and its write
        # sees "". Read the values the node ends with: after a pass that began once ours were written.
        reconciler = env.agent.parts.reconciler
        assert reconciler is not None
        after = reconciler.passes + 2  # the pass running now may have read the files before our writes
        await wait_until(lambda: reconciler.passes >= after, timeout=30, message="two reconcile passes")
        wrong = []
        for (level, name), want in EXPECTED[case].items():
            raw = executor.read(pod_dir if level == "pod" else cdir, name)
            assert raw is not None
            res = get_resource(name)
            ok = (
                raw == inherited
                if want == INHERIT
                else same_value(res, version, raw, render(res, want, version))
            )
            if not ok:
                wrong.append((level, name, want, raw))
        assert wrong == []
