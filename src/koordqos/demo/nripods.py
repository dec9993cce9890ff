"""The demo's two pods as the mock NRI runtime reports them to the agent (cgroupfs driver, containerd).

The LS pod (Koordinator QoS LS, Kubernetes Burstable, one container `probe` requesting the probes' CPU) and
the BE pod (BE / BestEffort, one container `burner`). Cgroup parents are relative to the agent's cgroup
root, which is the scratch tree (or the synthetic node), so they read like a real node's.
"""

from __future__ import annotations

from koordqos.demo.cgtree import BE_CONTAINER, BE_UID, LS_CONTAINER, LS_UID
from koordqos.nri.api import nri_api_pb2 as api

NAMESPACE = "koordqos-demo"
QOS_LABEL = "koordinator.sh/qosClass"


def _sandbox(uid: str, name: str, qos: str, parent: str, index: int) -> api.PodSandbox:
    pod = api.PodSandbox(
        id=f"{index:02x}" + "d0" * 31,
        name=name,
        uid=uid,
        namespace=NAMESPACE,
        labels={
            QOS_LABEL: qos,
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.namespace": NAMESPACE,
            "io.kubernetes.pod.uid": uid,
        },
        runtime_handler="runc",
    )
    pod.linux.cgroup_parent = parent
    return pod


def _container(pod: api.PodSandbox, cid: str, name: str, shares: int) -> api.Container:
    ctr = api.Container(
        id=cid,
        pod_sandbox_id=pod.id,
        name=name,
        state=api.CONTAINER_RUNNING,
        labels={"io.kubernetes.container.name": name, "io.kubernetes.pod.uid": pod.uid},
    )
    ctr.linux.resources.cpu.shares.value = shares
    ctr.linux.resources.cpu.quota.value = -1
    ctr.linux.resources.cpu.period.value = 100_000
    ctr.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{cid}"
    return ctr


def demo_pods(ls_request_milli: int) -> tuple[list[api.PodSandbox], list[api.Container]]:
    """(sandboxes, containers) of the LS and BE pods."""
    ls = _sandbox(LS_UID, "ls-probes", "LS", f"/kubepods/burstable/pod{LS_UID}", 1)
    be = _sandbox(BE_UID, "be-burners", "BE", f"/kubepods/besteffort/pod{BE_UID}", 2)
    ls_shares = max(2, ls_request_milli * 1024 // 1000)
    return [ls, be], [
        _container(ls, LS_CONTAINER, "probe", ls_shares),
        _container(be, BE_CONTAINER, "burner", 2),
    ]
