"""Object builders for the fake API server: realistic pods, Nodes, NodeSLOs and NodeMetrics as raw dicts."""

from __future__ import annotations

import uuid
from typing import Any


def make_pod(
    name: str,
    node: str,
    namespace: str = "default",
    qos: str | None = None,
    uid: str | None = None,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    """A realistic pod dict for the fake server (one container `main`)."""
    lbl = dict(labels or {})
    if qos:
        lbl["koordinator.sh/qosClass"] = qos
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": lbl}
    meta["annotations"] = annotations or {}
    if uid:
        meta["uid"] = uid
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"requests": requests or {}, "limits": limits or {}},
            }
        ],
    }
    if priority is not None:
        spec["priority"] = priority
    status = {
        "phase": phase,
        "containerStatuses": [
            {
                "name": "main",
                "containerID": f"containerd://{uuid.uuid4().hex}",
                "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}},
            }
        ],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def make_node(
    name: str,
    cpu: str = "8",
    memory: str = "16Gi",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node dict with capacity = allocatable."""
    res = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "status": {"capacity": dict(res), "allocatable": dict(res)},
    }


def make_nodeslo(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A NodeSLO dict."""
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": name},
        "spec": spec,
    }


def make_nodemetric(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A NodeMetric as koord-manager creates it: name and spec only (no status, no ownerReference)."""
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": name},
        "spec": spec if spec is not None else {"metricCollectPolicy": {}},
    }
