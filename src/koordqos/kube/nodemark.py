"""NodeMarker: put a condition and a `PreferNoSchedule` taint on this node, or take them off (the PSI
interference rules' middle rung, docs/psi.md).

Both are read-modify-write of lists other parties own too (the kubelet's conditions, other controllers'
taints): the Node is read, only our entry is added, replaced or removed, and the change is sent as a merge
patch carrying the resourceVersion it was computed from, so a concurrent change makes it a 409 and it is
computed again (a few times, then given up, logged and counted: the next round tries again).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.errors import KubeError
from koordqos.kube.client import ApiError, KubeClient

log = structlog.get_logger("koordqos.kube.nodemark")

MARKS = Counter(
    "koordqos_node_marks_total",
    "Node condition and taint changes by the PSI interference rules, by action and outcome",
    ["action", "outcome"],
    registry=obs.REGISTRY,
)
ATTEMPTS = 5
Json = dict[str, Any]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def with_condition(
    conditions: list[Json], kind: str, on: bool, reason: str, message: str
) -> list[Json] | None:
    """The conditions with ours set to True/False (None: already so, nothing to write). The transition time
    moves only when the status does."""
    status = "True" if on else "False"
    out, found = [], False
    for c in conditions:
        if isinstance(c, dict) and c.get("type") == kind:
            found = True
            if c.get("status") == status:
                return None
            c = {**c, "status": status, "reason": reason, "message": message}
            c["lastTransitionTime"] = c["lastHeartbeatTime"] = _now()
        out.append(c)
    if not found:
        if not on:
            return None
        now = _now()
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "lastHeartbeatTime": now,
            }
        )
    return out


def with_taint(taints: list[Json], key: str, on: bool) -> list[Json] | None:
    """The taints with ours (`key`, effect PreferNoSchedule) present or absent (None: already so)."""
    ours = [
        t
        for t in taints
        if isinstance(t, dict) and t.get("key") == key and t.get("effect") == "PreferNoSchedule"
    ]
    if on == bool(ours):
        return None
    if on:
        return [*taints, {"key": key, "value": "true", "effect": "PreferNoSchedule"}]
    return [t for t in taints if t not in ours]


class NodeMarker:
    """The kube side of `strategies.framework.NodeMarker` for one node."""

    def __init__(self, client: Callable[[], Awaitable[KubeClient]], node_name: str) -> None:
        self._client = client
        self.node_name = node_name
        self.path = f"/api/v1/nodes/{node_name}"

    async def mark(self, condition: str, taint_key: str, reason: str, message: str) -> bool:
        """The condition True and the taint on; True when both hold afterwards."""
        return await self._set(condition, taint_key, True, reason, message)

    async def unmark(self, condition: str, taint_key: str, reason: str, message: str) -> bool:
        """The condition False and the taint off; True when both hold afterwards."""
        return await self._set(condition, taint_key, False, reason, message)

    async def _set(self, condition: str, taint_key: str, on: bool, reason: str, message: str) -> bool:
        action = "mark" if on else "unmark"
        ok = await self._update("status", lambda n: _status_patch(n, condition, on, reason, message), action)
        ok = await self._update("", lambda n: _spec_patch(n, taint_key, on), action) and ok
        return ok

    async def _update(self, sub: str, patch_of: Callable[[Json], Json | None], action: str) -> bool:
        path = f"{self.path}/{sub}" if sub else self.path
        what = "condition" if sub else "taint"
        for attempt in range(ATTEMPTS):
            try:
                client = await self._client()
                node = await client.request("GET", self.path)
                body = patch_of(node)
                if body is None:
                    MARKS.labels(f"{action}-{what}", "unchanged").inc()
                    return True
                rv = (node.get("metadata") or {}).get("resourceVersion")
                body["metadata"] = {"resourceVersion": rv}
                await client.request("PATCH", path, body=body, content_type="application/merge-patch+json")
            except ApiError as exc:
                if exc.status == 409 and attempt + 1 < ATTEMPTS:
                    await _pause(attempt)
                    continue
                return self._failed(action, what, str(exc))
            except KubeError as exc:
                return self._failed(action, what, str(exc))
            MARKS.labels(f"{action}-{what}", "written").inc()
            return True
        return self._failed(action, what, "conflicts")

    def _failed(self, action: str, what: str, error: str) -> bool:
        MARKS.labels(f"{action}-{what}", "failed").inc()
        obs.ERRORS.labels("node-marker", "api").inc()
        log.warning(
            "node mark not applied; tried again next round",
            node=self.node_name,
            action=action,
            what=what,
            error=error,
        )
        return False


async def _pause(attempt: int) -> None:
    """client-go's default back-off between conflict retries: 10 ms × 5^k, jitter 0.1."""
    await asyncio.sleep(0.01 * 5.0**attempt * (1 + random.random() * 0.1))


def _status_patch(node: Json, condition: str, on: bool, reason: str, message: str) -> Json | None:
    conditions = ((node.get("status") or {}).get("conditions")) or []
    new = with_condition(list(conditions), condition, on, reason, message)
    return None if new is None else {"status": {"conditions": new}}


def _spec_patch(node: Json, key: str, on: bool) -> Json | None:
    taints = ((node.get("spec") or {}).get("taints")) or []
    new = with_taint(list(taints), key, on)
    return None if new is None else {"spec": {"taints": new}}
