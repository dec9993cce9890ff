"""EventRecorder: Kubernetes Events (core/v1) about pods and NodeSLOs; failures are logged, never raised."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.errors import KoordQoSError
from koordqos.kube.client import KubeClient

log = structlog.get_logger("koordqos.kube.eventrecorder")

EVENTS_SENT = Counter(
    "koordqos_kube_events_recorded_total",
    "Kubernetes Events posted, by reason and result",
    ["reason", "result"],
    registry=obs.REGISTRY,
)


def pod_reference(namespace: str, name: str, uid: str) -> dict[str, str]:
    """involvedObject for a pod."""
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


def nodeslo_reference(name: str, uid: str = "") -> dict[str, str]:
    """involvedObject for a (cluster-scoped) NodeSLO."""
    ref = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "name": name}
    if uid:
        ref["uid"] = uid
    return ref


class EventRecorder:
    """Posts Events with source component `koordqos` and host = node name."""

    def __init__(
        self, client: Callable[[], Awaitable[KubeClient]], node_name: str, component: str = "koordqos"
    ) -> None:
        self._client = client
        self.node_name = node_name
        self.component = component

    async def record(self, involved: Mapping[str, str], event_type: str, reason: str, message: str) -> bool:
        """Post one Event; returns whether the API server accepted it."""
        namespace = involved.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{involved.get('name', 'object')}.{time.time_ns():x}",
                "namespace": namespace,
            },
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": self.component, "host": self.node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.node_name,
        }
        try:
            client = await self._client()
            await client.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except KoordQoSError as exc:
            EVENTS_SENT.labels(reason, "error").inc()
            obs.ERRORS.labels("kube-events", "post").inc()
            log.warning("could not record event", reason=reason, object=involved.get("name"), error=str(exc))
            return False
        EVENTS_SENT.labels(reason, "ok").inc()
        return True
