"""Reflector handlers: raw pod / Node / NodeSLO dicts → slim models → bus events.

* pods on this node: a list publishes `PodsReplaced` (only when something differs from what was published),
  events publish `PodUpserted` / `PodDeleted`; `SourceSynced("pods")` after the first list.
* the Node: `NodeUpdated` when anything but its resourceVersion changed; `SourceSynced("node")` once seen.
* the NodeSLO named after the node: validated field by field (`validate_nodeslo`, the validator of `config
  validate`) and merged with defaults; an invalid field keeps its last valid value (or the default) and the
  rest applies, a document that is not a NodeSLO keeps the last good NodeSLO (each logged once, counted,
  and a Warning Event on the object); a missing object (or CRD) means the defaults; `NodeSLOUpdated` only
  when the merged spec changed; `SourceSynced("nodeslo")` after the first list.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.errors import ModelError
from koordqos.events.types import (
    NodeSLOUpdated,
    NodeUpdated,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    SourceSynced,
)
from koordqos.kube.eventrecorder import EventRecorder, nodeslo_reference
from koordqos.kube.watch import WatchEvent
from koordqos.model.node import NodeInfo, parse_node
from koordqos.model.nodeslo import NodeSLO, default_nodeslo
from koordqos.model.nodeslo_lint import nodeslo_unknown_keys
from koordqos.model.nodeslo_validate import ValidatedNodeSLO, validate_nodeslo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.model.wirevalue import FieldProblem
from koordqos.once import SeenOnce

if TYPE_CHECKING:
    from koordqos.bus import EventBus

log = structlog.get_logger("koordqos.kube.sources")
T = TypeVar("T")

NODESLO_UNKNOWN_FIELDS = Counter(
    "koordqos_nodeslo_unknown_fields_total",
    "NodeSLO keys the agent does not know (typos or newer fields; ignored), each path counted once",
    ["source"],
    registry=obs.REGISTRY,
)
NODESLO_INVALID = Counter(
    "koordqos_nodeslo_invalid_total",
    "NodeSLO objects rejected (the last good one kept)",
    ["source"],
    registry=obs.REGISTRY,
)
NODESLO_INVALID_FIELDS = Counter(
    "koordqos_nodeslo_invalid_fields_total",
    "NodeSLO field values rejected (the field's last valid value or default kept), each problem counted once",
    ["source"],
    registry=obs.REGISTRY,
)

PODS_PATH = "/api/v1/pods"
NODES_PATH = "/api/v1/nodes"
NODESLOS_PATH = "/apis/slo.koordinator.sh/v1alpha1/nodeslos"
PARSE_BATCH = 25  # pods parsed between yields to the loop during a re-list (~25-50 µs each)


def _meta(obj: Any) -> Mapping[str, Any]:
    """The object's metadata, or {} when the object or its metadata is not a mapping."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def _uid(obj: Any) -> str:
    return str(_meta(obj).get("uid", ""))


_malformed_seen: SeenOnce[str] = SeenOnce()


def _parse(parse: Callable[[Any], T], raw: Any, kind: str) -> T | None:
    """Parse one API object; a malformed one is counted, logged once (per object) and skipped."""
    try:
        if not isinstance(raw, Mapping):
            raise TypeError(f"expected an object, got {type(raw).__name__}")
        return parse(raw)
    except Exception as exc:  # any shape the parser did not expect: skip the object, keep the watch
        obs.ERRORS.labels("kube", f"malformed-{kind}").inc()
        meta = _meta(raw)
        key = f"{kind}/{meta.get('namespace', '')}/{meta.get('name', '')}/{type(exc).__name__}"
        if _malformed_seen.first(key):
            log.warning(
                "malformed object skipped",
                kind=kind,
                name=str(meta.get("name", "")),
                namespace=str(meta.get("namespace", "")),
                error=f"{type(exc).__name__}: {exc}",
            )
        return None


def _identified_pod(raw: Mapping[str, Any]) -> PodInfo:
    """parse_pod (total: a bad label/annotation/part is left out of the pod, never the pod dropped), then
    reject only what cannot be a pod at all: an object without `metadata.uid`."""
    pod = parse_pod(raw)
    if not pod.uid:
        raise ModelError("no metadata.uid")
    return pod


class PodSource:
    """Pods of this node (field selector `spec.nodeName`)."""

    def __init__(self, bus: EventBus, node_name: str) -> None:
        self.bus = bus
        self.node_name = node_name
        self.known: dict[str, str] = {}  # uid → resourceVersion last published
        self._synced = False

    async def on_list(self, items: list[dict[str, Any]]) -> None:
        """A full list: publish PodsReplaced when it differs from what subscribers already have."""
        pods: list[PodInfo] = []
        for i, raw in enumerate(items):
            if i and i % PARSE_BATCH == 0:
                await asyncio.sleep(0)
            pod = _parse(_identified_pod, raw, "pod")
            if pod is not None and pod.uid and self._mine(pod):
                pods.append(pod)
        listed = {p.uid: p.resource_version for p in pods}
        if listed != self.known or not self._synced:
            gone = self.known.keys() - listed.keys()
            if gone:
                log.info("pods deleted while not watching", count=len(gone))
            self.known = listed
            await self.bus.publish(PodsReplaced(tuple(pods), source="api"))
        if not self._synced:
            self._synced = True
            await self.bus.publish(SourceSynced("pods"))

    async def on_event(self, event: WatchEvent) -> None:
        """ADDED/MODIFIED → PodUpserted; DELETED → PodDeleted."""
        uid = _uid(event.object)
        if not uid:
            return
        if event.type == "DELETED":
            if self.known.pop(uid, None) is not None:
                await self.bus.publish(PodDeleted(uid))
            return
        pod = _parse(_identified_pod, event.object, "pod")
        if pod is None:
            return
        if not self._mine(pod):
            # moved off this node (or a server that ignores the field selector)
            if self.known.pop(uid, None) is not None:
                await self.bus.publish(PodDeleted(uid))
            return
        if self.known.get(uid) == pod.resource_version and pod.resource_version:
            return
        self.known[uid] = pod.resource_version
        await self.bus.publish(PodUpserted(pod))

    async def on_absent(self) -> None:
        """Pods are always served; nothing to do."""

    def _mine(self, pod: PodInfo) -> bool:
        return not self.node_name or pod.node_name == self.node_name


class NodeSource:
    """This node's Node object (field selector `metadata.name`)."""

    def __init__(self, bus: EventBus, node_name: str) -> None:
        self.bus = bus
        self.node_name = node_name
        self.current: NodeInfo | None = None
        self._synced = False

    async def on_list(self, items: list[dict[str, Any]]) -> None:
        """Publish the node if listed; a missing Node is logged and keeps the agent not ready."""
        for raw in items:
            if _meta(raw).get("name") == self.node_name:
                await self._apply(raw)
                return
        log.warning("Node object not found; waiting for it", node=self.node_name)

    async def on_event(self, event: WatchEvent) -> None:
        """ADDED/MODIFIED → NodeUpdated when it changed; DELETED is logged (the last view is kept)."""
        if _meta(event.object).get("name") != self.node_name:
            return
        if event.type == "DELETED":
            log.warning("Node object deleted; keeping the last view", node=self.node_name)
            return
        await self._apply(event.object)

    async def on_absent(self) -> None:
        """Nodes are always served."""

    async def _apply(self, raw: dict[str, Any]) -> None:
        node = _parse(parse_node, raw, "node")
        if node is None:
            return
        if self.current is None or _node_key(node) != _node_key(self.current):
            self.current = node
            await self.bus.publish(NodeUpdated(node))
        if not self._synced:
            self._synced = True
            await self.bus.publish(SourceSynced("node"))


def _node_key(node: NodeInfo) -> tuple[Any, ...]:
    return (dict(node.labels), dict(node.annotations), dict(node.capacity), dict(node.allocatable), node.uid)


class NodeSLOSource:
    """The NodeSLO named after the node, merged with defaults; invalid ones keep the last good."""

    def __init__(
        self, bus: EventBus, node_name: str, recorder: EventRecorder | None = None, source: str = "api"
    ) -> None:
        self.bus = bus
        self.node_name = node_name
        self.recorder = recorder
        self.source = source
        self.current: NodeSLO | None = None
        self.last_error = ""
        self.invalid_count = 0
        self._valid: ValidatedNodeSLO | None = None  # the last verdict: its fields are the last valid values
        self._unknown_seen: SeenOnce[str] = SeenOnce()
        # the problems of the last verdict: a problem is reported when it appears (a relist of the same
        # object repeats none; the same bad value after a valid one is a new rejection)
        self._reported: frozenset[tuple[str, str, str]] = frozenset()
        self._synced = False
        self._tasks: set[asyncio.Task[Any]] = set()

    async def on_list(self, items: list[dict[str, Any]]) -> None:
        """The object if listed, else the defaults."""
        for raw in items:
            if _meta(raw).get("name") == self.node_name:
                await self.apply(raw)
                return
        await self.apply_default("no NodeSLO object for this node")

    async def on_event(self, event: WatchEvent) -> None:
        """ADDED/MODIFIED → apply; DELETED → defaults."""
        if _meta(event.object).get("name") != self.node_name:
            return
        if event.type == "DELETED":
            await self.apply_default("NodeSLO deleted")
        else:
            await self.apply(event.object)

    async def on_absent(self) -> None:
        """The NodeSLO CRD is not installed: defaults."""
        await self.apply_default("NodeSLO resource type not served by the API server")

    async def apply_default(self, why: str) -> None:
        """Use koordlet's defaults."""
        log.info("using default NodeSLO", node=self.node_name, reason=why)
        self._valid = None
        self._reported = frozenset()
        await self._publish(default_nodeslo())

    async def apply(self, raw: dict[str, Any]) -> None:
        """Validate and merge `raw`: an invalid field keeps its last valid value; a document that is not a
        NodeSLO keeps the last good one (defaults if none yet)."""
        try:
            verdict = validate_nodeslo(raw, self._valid)
        except ModelError as exc:
            self.invalid_count += 1
            self.last_error = str(exc)
            NODESLO_INVALID.labels(self.source).inc()
            obs.ERRORS.labels("nodeslo", "invalid").inc()
            meta = _meta(raw)
            log.error(
                "invalid NodeSLO; keeping the last good one",
                node=self.node_name,
                error=str(exc),
                resource_version=meta.get("resourceVersion"),
                have_last_good=self.current is not None,
            )
            self._warn_event(raw, f"NodeSLO rejected: {exc}")
            await self._publish(self.current or default_nodeslo())
            return
        self._valid = verdict
        self.last_error = "; ".join(p.describe() for p in verdict.problems)
        reported = frozenset(p.key for p in verdict.problems)
        for problem in verdict.problems:
            if problem.key not in self._reported:
                self._report_field(raw, problem)
        self._reported = reported
        self._warn_unknown(raw)
        await self._publish(verdict.slo)

    def _warn_event(self, raw: Mapping[str, Any], message: str) -> None:
        """A Warning Event on the NodeSLO (cluster mode; the recorder limits repeats)."""
        if self.recorder is None:
            return
        meta = _meta(raw)
        ref = nodeslo_reference(str(meta.get("name", self.node_name)), str(meta.get("uid", "")))
        task = asyncio.get_running_loop().create_task(
            self.recorder.record(ref, "Warning", "InvalidNodeSLO", message)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _report_field(self, raw: Mapping[str, Any], problem: FieldProblem) -> None:
        """A rejected field: logged, counted and an Event, once each time the problem appears."""
        NODESLO_INVALID_FIELDS.labels(self.source).inc()
        obs.ERRORS.labels("nodeslo", "invalid-field").inc()
        log.error(
            "invalid NodeSLO field; keeping its last valid value",
            node=self.node_name,
            problem=problem.describe(),
            resource_version=_meta(raw).get("resourceVersion"),
        )
        self._warn_event(raw, f"NodeSLO field rejected, its last valid value kept: {problem.describe()}")

    def _warn_unknown(self, raw: Mapping[str, Any]) -> None:
        """Unknown keys are ignored (a cluster may carry newer CRD fields), logged and counted once each."""
        for unknown in nodeslo_unknown_keys(raw):
            if self._unknown_seen.first(unknown.path):
                NODESLO_UNKNOWN_FIELDS.labels(self.source).inc()
                log.warning(
                    "unknown NodeSLO field ignored",
                    node=self.node_name,
                    field=unknown.path,
                    suggestion=unknown.suggestion,
                    resource_version=_meta(raw).get("resourceVersion"),
                )

    async def _publish(self, slo: NodeSLO) -> None:
        if self.current is None or _spec_key(slo) != _spec_key(self.current):
            self.current = slo
            await self.bus.publish(NodeSLOUpdated(slo))
        if not self._synced:
            self._synced = True
            await self.bus.publish(SourceSynced("nodeslo"))


def _spec_key(slo: NodeSLO) -> dict[str, Any]:
    return slo.model_dump(exclude={"resource_version", "generation", "name"})
