"""Rate-limited Events: at most one Event per (object, reason) per interval; the ones held back are counted
and summed into the next Event's message ("… (+3 more in 60 s)").

A strategy that acts every tick (CPU suppress moving the BE quota, an eviction storm) must not flood the API
server with Events; the first of a burst goes out at once, so an operator still sees it happen.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.kube.client import KubeClient
from koordqos.kube.eventrecorder import EventRecorder

EVENTS_HELD = Counter(
    "koordqos_kube_events_rate_limited_total",
    "Kubernetes Events not posted because one with the same object and reason was posted recently",
    ["reason"],
    registry=obs.REGISTRY,
)
DEFAULT_INTERVAL_SECONDS = 60.0
MAX_KEYS = 4096


@dataclass
class _Slot:
    last: float
    held: int = 0


def object_key(involved: Mapping[str, str]) -> str:
    """One key per involved object (kind, namespace, name)."""
    return f"{involved.get('kind', '')}/{involved.get('namespace', '')}/{involved.get('name', '')}"


class RateLimitedRecorder(EventRecorder):
    """An EventRecorder that holds back repeats (see the module docstring)."""

    def __init__(
        self,
        client: Callable[[], Awaitable[KubeClient]],
        node_name: str,
        component: str = "koordqos",
        interval: float = DEFAULT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, node_name, component)
        self.interval = interval
        self._clock = clock
        self._slots: dict[tuple[str, str], _Slot] = {}

    def admit(self, involved: Mapping[str, str], reason: str) -> int | None:
        """None when this Event is held back; else how many were held back since the last one posted."""
        now = self._clock()
        key = (object_key(involved), reason)
        slot = self._slots.get(key)
        if slot is not None and now - slot.last < self.interval:
            slot.held += 1
            EVENTS_HELD.labels(reason).inc()
            return None
        held = slot.held if slot is not None else 0
        if len(self._slots) >= MAX_KEYS:  # objects come and go: forget the oldest half
            for k in sorted(self._slots, key=lambda k: self._slots[k].last)[: MAX_KEYS // 2]:
                del self._slots[k]
        self._slots[key] = _Slot(now)
        return held

    async def record(self, involved: Mapping[str, str], event_type: str, reason: str, message: str) -> bool:
        """Post the Event unless one like it went out within the interval; False when held back or failed."""
        held = self.admit(involved, reason)
        if held is None:
            return False
        if held:
            message = f"{message} (+{held} more in the last {self.interval:g} s)"
        return await super().record(involved, event_type, reason, message)
