"""Realistic NRI pods and containers as containerd reports them (cgroupfs driver), for tests/benches."""

from __future__ import annotations

from koordqos.nri.api import nri_api_pb2 as api


def sample_pod(i: int, qos: str = "besteffort") -> api.PodSandbox:
    """A realistic pod sandbox as containerd reports it (cgroupfs driver)."""
    uid = f"0000{i:04d}-1a2b-4c3d-8e9f-{i:012d}"
    parent = f"/kubepods/{qos}/pod{uid}" if qos != "guaranteed" else f"/kubepods/pod{uid}"
    pod = api.PodSandbox(
        id=f"{i:08x}" + "ab" * 28,
        name=f"pod-{i}",
        uid=uid,
        namespace="default",
        labels={
            "app": f"app-{i % 17}",
            "io.kubernetes.pod.name": f"pod-{i}",
            "io.kubernetes.pod.namespace": "default",
            "io.kubernetes.pod.uid": uid,
        },
        annotations={
            "kubernetes.io/config.seen": "2026-08-20T10:00:00Z",
            "kubernetes.io/config.source": "api",
            "koordinator.sh/qosClass": "BE" if qos == "besteffort" else "LS",
        },
        runtime_handler="runc",
        ips=[f"10.1.{i // 250}.{i % 250 + 1}"],
    )
    pod.linux.cgroup_parent = parent
    pod.linux.pod_resources.cpu.shares.value = 2
    pod.linux.namespaces.add(type="network", path=f"/var/run/netns/cni-{i}")
    return pod


def sample_container(pod: api.PodSandbox, j: int, state: int = api.CONTAINER_RUNNING) -> api.Container:
    """A realistic container of `pod` (env, mounts, resources, cgroups path)."""
    cid = f"{j:04x}" + pod.id[4:]
    ctr = api.Container(
        id=cid,
        pod_sandbox_id=pod.id,
        name=f"c{j}",
        state=state,  # type: ignore[arg-type]
        labels={"io.kubernetes.container.name": f"c{j}", "io.kubernetes.pod.uid": pod.uid},
        annotations={"io.kubernetes.container.hash": "1a2b3c4d", "io.kubernetes.container.restartCount": "0"},
        args=["/bin/app", "--serve", f"--port={8000 + j}"],
        env=[
            "KUBERNETES_SERVICE_HOST=10.96.0.1",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            f"POD_NAME={pod.name}",
        ],
        pid=10000 + j,
    )
    for dest in ("/etc/hosts", "/dev/termination-log", "/var/run/secrets/kubernetes.io/serviceaccount"):
        ctr.mounts.add(
            destination=dest,
            type="bind",
            source=f"/var/lib/kubelet/pods/{pod.uid}{dest}",
            options=["rbind", "rprivate", "rw"],
        )
    res = ctr.linux.resources
    res.cpu.shares.value = 2
    res.cpu.quota.value = -1
    res.cpu.period.value = 100000
    res.memory.limit.value = 0
    ctr.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{cid}"
    ctr.linux.oom_score_adj.value = 1000
    return ctr


def sample_node(pods: int, containers_per_pod: int) -> tuple[list[api.PodSandbox], list[api.Container]]:
    """`pods` sample pods with `containers_per_pod` containers each."""
    ps = [sample_pod(i) for i in range(pods)]
    return ps, [sample_container(p, j) for p in ps for j in range(containers_per_pod)]
