"""Events and the bus that carries them from sources to strategies, hooks and the reconciler."""

from koordqos.events.bus import EventBus
from koordqos.events.types import (
    Event,
    MetricTick,
    NodeSLOUpdated,
    NodeUpdated,
    NRIConnectionChanged,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RuntimeContainerRemoved,
    RuntimeContainerUpserted,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
    SourceSynced,
)

__all__ = [
    "Event",
    "EventBus",
    "MetricTick",
    "NRIConnectionChanged",
    "NodeSLOUpdated",
    "NodeUpdated",
    "PodDeleted",
    "PodUpserted",
    "PodsReplaced",
    "RuntimeContainerRemoved",
    "RuntimeContainerUpserted",
    "RuntimeSandboxRemoved",
    "RuntimeSandboxUpserted",
    "RuntimeSynchronized",
    "SourceSynced",
]
