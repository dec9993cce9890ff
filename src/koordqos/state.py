"""NodeState and its pure reducer: the one consistent view every subscriber reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from koordqos.events.types import (
    Event,
    MetricTick,
    NodeSLOUpdated,
    NodeUpdated,
    NRIConnectionChanged,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RuntimeContainer,
    RuntimeContainerRemoved,
    RuntimeContainerUpserted,
    RuntimeSandbox,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
    SourceSynced,
)
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import PodInfo


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeState:
    """Immutable snapshot of what the agent knows; replaced (never mutated) by `reduce`."""

    pods: Mapping[str, PodInfo] = field(default_factory=_empty)  # by uid
    node: NodeInfo | None = None
    node_slo: NodeSLO | None = None
    sandboxes: Mapping[str, RuntimeSandbox] = field(default_factory=_empty)  # by sandbox id
    containers: Mapping[str, RuntimeContainer] = field(default_factory=_empty)  # by container id
    synced: frozenset[str] = frozenset()
    nri_connected: bool = False
    last_tick: MetricTick | None = None
    generation: int = 0

    def pod_by_name(self, namespace: str, name: str) -> PodInfo | None:
        """Find a pod by namespace/name."""
        for pod in self.pods.values():
            if pod.namespace == namespace and pod.name == name:
                return pod
        return None


def _with(m: Mapping[str, Any], key: str, value: Any) -> Mapping[str, Any]:
    d = dict(m)
    d[key] = value
    return MappingProxyType(d)


def _without(m: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    if key not in m:
        return m
    d = dict(m)
    del d[key]
    return MappingProxyType(d)


def reduce(state: NodeState, event: Event) -> NodeState:
    """Return the state after `event`. Pure: no I/O, never mutates `state`."""
    match event:
        case MetricTick():
            return replace(state, last_tick=event)
        case PodUpserted(pod=pod):
            new = replace(state, pods=_with(state.pods, pod.uid, pod))
        case PodDeleted(uid=uid):
            if uid not in state.pods:
                return state
            new = replace(state, pods=_without(state.pods, uid))
        case PodsReplaced(pods=pods, source=source):
            kept = {u: p for u, p in state.pods.items() if p.source != source}
            kept.update({p.uid: p for p in pods})
            new = replace(state, pods=MappingProxyType(kept))
        case NodeUpdated(node=node):
            new = replace(state, node=node)
        case NodeSLOUpdated(slo=slo):
            new = replace(state, node_slo=slo)
        case SourceSynced(source=source):
            if source in state.synced:
                return state
            new = replace(state, synced=state.synced | {source})
        case NRIConnectionChanged(connected=connected):
            new = replace(state, nri_connected=connected)
        case RuntimeSandboxUpserted(sandbox=sb):
            new = replace(state, sandboxes=_with(state.sandboxes, sb.id, sb))
        case RuntimeSandboxRemoved(id=sid):
            containers = {k: c for k, c in state.containers.items() if c.sandbox_id != sid}
            new = replace(
                state,
                sandboxes=_without(state.sandboxes, sid),
                containers=MappingProxyType(containers),
            )
        case RuntimeContainerUpserted(container=ctr):
            new = replace(state, containers=_with(state.containers, ctr.id, ctr))
        case RuntimeSynchronized(sandboxes=sbs, containers=ctrs):
            new = replace(
                state,
                sandboxes=MappingProxyType({sb.id: sb for sb in sbs}),
                containers=MappingProxyType({c.id: c for c in ctrs}),
            )
        case RuntimeContainerRemoved(id=cid):
            new = replace(state, containers=_without(state.containers, cid))
        case _:
            return state
    return replace(new, generation=state.generation + 1)
