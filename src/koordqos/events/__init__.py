"""Events and the bus that carries them from sources to strategies, hooks and the reconciler."""

from koordqos.events.bus import EventBus, FailurePolicy, RequestResult
from koordqos.events.types import (
    Event,
    MetricTick,
    NodeSLOUpdated,
    NodeUpdated,
    NRIConnectionChanged,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RequestEvent,
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
    "FailurePolicy",
    "MetricTick",
    "NRIConnectionChanged",
    "NodeSLOUpdated",
    "NodeUpdated",
    "PodDeleted",
    "PodUpserted",
    "PodsReplaced",
    "RequestEvent",
    "RequestResult",
    "RuntimeContainerRemoved",
    "RuntimeContainerUpserted",
    "RuntimeSandboxRemoved",
    "RuntimeSandboxUpserted",
    "RuntimeSynchronized",
    "SourceSynced",
]
