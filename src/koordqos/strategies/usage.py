"""Usage split (docs/behaviour-qos-manager.md; koordlet's `CalculateFilterPodsUsed`) and the node facts CPU
suppress reads. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from koordqos.model import jsontext
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import HostApplicationSpec
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, PriorityClass, QoSClass

ANNOTATION_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"

H = TypeVar("H")


def calculate_filter_pods_used(
    node_used: float,
    node_reserved: float,
    pods: Mapping[str, PodInfo],
    pod_used: Mapping[str, float],
    host_apps: Iterable[H],
    host_app_used: Mapping[str, float],
    pod_filter: Callable[[PodInfo], bool],
    host_app_filter: Callable[[H], bool],
    host_app_name: Callable[[H], str],
) -> tuple[float, float, float]:
    """(Σ filtered pod usage, Σ filtered host-app usage, system usage); unknown pod UIDs count as filtered."""
    pods_all = 0.0
    pods_filtered = 0.0
    for uid, used in pod_used.items():
        pods_all += used
        pod = pods.get(uid)
        if pod is None or pod_filter(pod):
            pods_filtered += used
    apps_all = 0.0
    apps_filtered = 0.0
    for app in host_apps:
        name = host_app_name(app)
        if name not in host_app_used:
            continue
        used = host_app_used[name]
        apps_all += used
        if host_app_filter(app):
            apps_filtered += used
    system = max(node_used - pods_all - apps_all, 0.0, node_reserved)
    return pods_filtered, apps_filtered, system


def non_be_pod(pod: PodInfo) -> bool:
    """NonBEPodFilter: label QoS is not BE and Kubernetes QoS is not BestEffort."""
    return pod.qos_raw is not QoSClass.BE and pod.kube_qos is not KubeQoS.BESTEFFORT


def not_batch_or_free_pod(pod: PodInfo) -> bool:
    """NotBatchOrFreePodFilter: priority class (with default) is neither koord-batch nor koord-free."""
    return pod.priority_class not in (PriorityClass.BATCH, PriorityClass.FREE)


def non_be_host_app(app: HostApplicationSpec) -> bool:
    """NonBEHostAppFilter: non-BE unless QoS BE with a cgroup path based on the besteffort dir."""
    return not (
        app.qos == QoSClass.BE.value
        and app.cgroup_path is not None
        and app.cgroup_path.base == "KubepodsBesteffort"
    )


def cpu_manager_policy(node: NodeInfo | None) -> str:
    """The kubelet CPU manager policy (`kubelet.koordinator.sh/cpu-manager-policy`; "" when absent/bad)."""
    if node is None:
        return ""
    raw = node.annotations.get(ANNOTATION_CPU_MANAGER_POLICY)
    if not raw:
        return ""
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        return ""
    policy = doc.get("policy") if isinstance(doc, dict) else None
    return policy if isinstance(policy, str) else ""


def reserved_cpus(node: NodeInfo | None) -> frozenset[int]:
    """CPUs in the node's reservation annotation `reservedCPUs`."""
    res = node.reservation if node is not None else None
    return frozenset(res.reserved_cpus) if res is not None else frozenset()


def system_qos_exclusive_cpus(node: NodeInfo | None) -> frozenset[int]:
    """CPUs of the system-QoS resource annotation when it is exclusive (the default)."""
    sq = node.system_qos_resource if node is not None else None
    if sq is None or not sq.cpuset_exclusive:
        return frozenset()
    return frozenset(sq.cpuset)
