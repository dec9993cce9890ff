"""Typed, frozen event dataclasses published on the bus."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from koordqos.events.records import RuntimeContainer, RuntimeSandbox
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import PodInfo

# RuntimeSandbox and RuntimeContainer live in events/records.py (compiled in the compiled build) and are
# re-exported from here, where the bus's other records are imported from
__all__ = [
    "Event",
    "MetricTick",
    "NRIConnectionChanged",
    "NodeSLOUpdated",
    "NodeUpdated",
    "PodDeleted",
    "PodUpserted",
    "PodsReplaced",
    "RuntimeContainer",
    "RuntimeContainerRemoved",
    "RuntimeContainerUpserted",
    "RuntimeSandbox",
    "RuntimeSandboxRemoved",
    "RuntimeSandboxUpserted",
    "RuntimeSynchronized",
    "SourceSynced",
]


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every published event. `coalesce` events replace an undelivered one of the same type."""

    coalesce: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class PodUpserted(Event):
    """A pod was added or changed."""

    pod: PodInfo


@dataclass(frozen=True, slots=True)
class PodDeleted(Event):
    """A pod is gone."""

    uid: str


@dataclass(frozen=True, slots=True)
class PodsReplaced(Event):
    """A full re-list: the pods of `source` are exactly these (deletions while away are detected)."""

    pods: tuple[PodInfo, ...]
    source: str = "api"


@dataclass(frozen=True, slots=True)
class NodeUpdated(Event):
    """The Node object changed."""

    node: NodeInfo


@dataclass(frozen=True, slots=True)
class NodeSLOUpdated(Event):
    """A valid NodeSLO (already merged with defaults) is in force."""

    slo: NodeSLO


@dataclass(frozen=True, slots=True)
class VolumeClaimsReplaced(Event):
    """The bound PersistentVolumeClaims: `namespace/claim` → PersistentVolume name (blkio pod volumes)."""

    claims: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SourceSynced(Event):
    """A source finished its initial list (`pods`, `node`, `nodeslo`)."""

    source: str


@dataclass(frozen=True, slots=True)
class NRIConnectionChanged(Event):
    """The NRI plugin connected to or lost its runtime."""

    connected: bool
    runtime: str = ""


@dataclass(frozen=True, slots=True)
class RuntimeSandboxUpserted(Event):
    """The runtime created or synchronised a sandbox."""

    sandbox: RuntimeSandbox


@dataclass(frozen=True, slots=True)
class RuntimeSandboxRemoved(Event):
    """The runtime removed a sandbox."""

    id: str


@dataclass(frozen=True, slots=True)
class RuntimeContainerUpserted(Event):
    """The runtime created, started or synchronised a container."""

    container: RuntimeContainer


@dataclass(frozen=True, slots=True)
class RuntimeContainerRemoved(Event):
    """The runtime removed a container."""

    id: str


@dataclass(frozen=True, slots=True)
class RuntimeSynchronized(Event):
    """After an NRI Synchronize: the runtime's sandboxes and containers are exactly these.

    One event instead of one per object keeps a 400-container Synchronize to one state copy.
    """

    sandboxes: tuple[RuntimeSandbox, ...]
    containers: tuple[RuntimeContainer, ...]


@dataclass(frozen=True, slots=True)
class MetricTick(Event):
    """One metrics-collection round finished; `sample` is the collector's snapshot."""

    coalesce: ClassVar[bool] = True
    at: float
    sample: Any = None
