"""Objects for the real API server, and the things a kubelet would do that no process does here.

A real kube-apiserver assigns UIDs, ignores `status` on create and has no kubelet: `create_running_pod`
creates the pod bound to a node, then writes its status (Running, Ready) through the status subresource,
as the kubelet would.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from koordqos.testing.poll import Message, wait_until_sync

from .controlplane import Api, ApiError

POLL = 0.05  # the real server and the agent answer in ms; no need to poll faster


def eventually(predicate: Any, timeout: float, what: Message) -> None:
    """wait_until_sync at this suite's polling interval."""
    wait_until_sync(predicate, timeout, POLL, what)


NODESLO_PATH = "/apis/slo.koordinator.sh/v1alpha1/nodeslos"
NODEMETRIC_PATH = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics"
NRT_PATH = "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies"


def unique(prefix: str) -> str:
    """A DNS-1123 name no other test uses."""
    return f"{prefix}-{secrets.token_hex(3)}"


def create_namespace(api: Api, name: str) -> None:
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def create_node(api: Api, name: str, cpu: str = "4", memory: str = "16Gi") -> dict[str, Any]:
    """A Node with capacity = allocatable, Ready, as a kubelet would register it."""
    res = {"cpu": cpu, "memory": memory, "pods": "110"}
    node = api.create(
        "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}}}
    )
    node["status"] = {
        "capacity": dict(res),
        "allocatable": dict(res),
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}],
    }
    return dict(api.put(f"/api/v1/nodes/{name}/status", node))


def running_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The status a kubelet gives a started one-container pod: Running, Ready, its container running."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        **pod.get("status", {}),
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [
            {
                "name": "main",
                "image": "busybox",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "containerID": f"containerd://{secrets.token_hex(32)}",
                "state": {"running": {"startedAt": now}},
            }
        ],
    }


def create_running_pod(
    api: Api,
    namespace: str,
    name: str,
    node: str,
    qos: str | None = None,
    labels: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """A pod bound to `node`, then marked Running and Ready through pods/status (what the kubelet does)."""
    lbl = dict(labels or {})
    if qos:
        lbl["koordinator.sh/qosClass"] = qos
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if requests or limits:
        container["resources"] = {"requests": requests or {}, "limits": limits or {}}
    spec: dict[str, Any] = {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 0}
    if priority is not None:
        # the Priority admission plugin refuses spec.priority; it resolves a PriorityClass into it
        spec["priorityClassName"] = ensure_priority_class(api, priority)
    pod = api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": lbl}, "spec": spec},
    )
    pod["status"] = running_status(pod)
    return dict(api.put(f"/api/v1/namespaces/{namespace}/pods/{name}/status", pod))


def annotate_node(api: Api, name: str, annotations: dict[str, str]) -> None:
    """Add annotations to a Node (GET + PUT)."""
    node = api.get(f"/api/v1/nodes/{name}")
    node["metadata"].setdefault("annotations", {}).update(annotations)
    api.put(f"/api/v1/nodes/{name}", node)


def nodemetric(name: str, report_interval: int = 60) -> dict[str, Any]:
    """The NodeMetric koord-manager creates for a node (spec only)."""
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": name},
        "spec": {
            "metricCollectPolicy": {
                "aggregateDurationSeconds": 60,
                "reportIntervalSeconds": report_interval,
                "nodeAggregatePolicy": {"durations": ["5m0s", "10m0s", "30m0s"]},
                "nodeMemoryCollectPolicy": "usageWithoutPageCache",
            }
        },
    }


def ensure_priority_class(api: Api, value: int) -> str:
    """The name of a PriorityClass with `value`, created if missing."""
    name = f"e2e-priority-{value}"
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    try:
        api.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
    except ApiError as exc:
        if exc.status != 409:
            raise
    return name


def nodeslo(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": name},
        "spec": spec,
    }


def try_get(api: Api, path: str) -> dict[str, Any] | None:
    """The object, or None on 404."""
    try:
        return dict(api.get(path))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def set_pdb(api: Api, ns: str, name: str, selector: dict[str, str], allowed: int) -> None:
    """A PDB, and the status the disruption controller (not running here) would give it: `allowed`."""
    path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    current = try_get(api, f"{path}/{name}")
    if current is None:
        current = api.create(
            path,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}},
            },
        )
    current["status"] = {
        "observedGeneration": current["metadata"]["generation"],
        "disruptionsAllowed": allowed,
        "currentHealthy": 1 + allowed,
        "desiredHealthy": 1,
        "expectedPods": 1 + allowed,
    }
    api.put(f"{path}/{name}/status", current)


def pod_events(api: Api, ns: str, pod: str) -> list[dict[str, Any]]:
    doc = api.get(f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{pod}")
    return list(doc["items"])


def evicted(api: Api, ns: str, pod: str) -> bool:
    """Gone, or terminating (no kubelet confirms the deletion here)."""
    current = try_get(api, f"/api/v1/namespaces/{ns}/pods/{pod}")
    return current is None or "deletionTimestamp" in current["metadata"]


def differences(stored: Any, sent: Any, path: str = "") -> list[str]:
    """Where a stored object differs from what was sent: "pruned <path>", "added <path>", "changed <path>"
    (an assertion message that says which field the server dropped)."""
    if isinstance(stored, dict) and isinstance(sent, dict):
        out = [f"pruned {path}.{k}" for k in sent if k not in stored]
        out += [f"added {path}.{k}" for k in stored if k not in sent]
        for k in sent.keys() & stored.keys():
            out += differences(stored[k], sent[k], f"{path}.{k}")
        return out
    if isinstance(stored, list) and isinstance(sent, list) and len(stored) == len(sent):
        return [
            d
            for i, (a, b) in enumerate(zip(stored, sent, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if stored == sent else [f"changed {path}: sent {sent!r}, stored {stored!r}"]
