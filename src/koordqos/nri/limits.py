"""How many runtime objects the agent tracks: a bound on what an NRI runtime can make NodeState hold.

NodeState keeps every pod sandbox and container the runtime reports until the runtime removes it, as it must
for a real runtime. A hostile (or broken) one can report new ids forever and never remove them; so past
`--nri-max-pod-sandboxes` / `--nri-max-containers` a *new* id is not tracked: the call is still answered
(the hooks run on the request's own data), the object stays out of NodeState (no pod in local mode, nothing
for the reconciler), each refusal is counted in `koordqos_nri_untracked_objects_total{kind}` and the first
one of each kind is logged. Ids already tracked are updated and removed as usual. The defaults are far above
a real node (kubelet allows 110 pods by default, large nodes 250; a few containers each, exited ones until
the kubelet removes them). A Synchronize is capped the same way while its chunks are collected.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TypeVar

import structlog
from prometheus_client import Counter

from koordqos import observability as obs

log = structlog.get_logger("koordqos.nri")

DEFAULT_MAX_SANDBOXES = 1024
DEFAULT_MAX_CONTAINERS = 8192

UNTRACKED = Counter(
    "koordqos_nri_untracked_objects_total",
    "Pod sandboxes / containers reported by the NRI runtime past the agent's limit, so not kept in its state",
    ["kind"],
    registry=obs.REGISTRY,
)

T = TypeVar("T")


class RuntimeObjectLimits:
    """The two caps and their refusals (see the module docstring)."""

    def __init__(
        self, max_sandboxes: int = DEFAULT_MAX_SANDBOXES, max_containers: int = DEFAULT_MAX_CONTAINERS
    ) -> None:
        self.max = {"sandbox": max_sandboxes, "container": max_containers}
        self._logged: set[str] = set()
        self._counters = {kind: UNTRACKED.labels(kind) for kind in self.max}

    def admit(self, kind: str, tracked: Mapping[str, object], object_id: str) -> bool:
        """Whether `object_id` may be kept: tracked already, or room for one more (else counted, logged)."""
        if object_id in tracked or len(tracked) < self.max[kind]:
            return True
        self.refused(kind, 1)
        return False

    def cap(self, kind: str, collected: Collection[object], incoming: list[T]) -> list[T]:
        """The part of `incoming` that fits after `collected` (a Synchronize's chunks so far)."""
        room = max(0, self.max[kind] - len(collected))
        if len(incoming) <= room:
            return incoming
        self.refused(kind, len(incoming) - room)
        return incoming[:room]

    def refused(self, kind: str, n: int) -> None:
        """Count `n` untracked objects of `kind`; log the first time."""
        self._counters[kind].inc(n)
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "NRI runtime reports more objects than the agent tracks; new ones are answered, not kept",
                kind=kind,
                limit=self.max[kind],
                flag="--nri-max-pod-sandboxes" if kind == "sandbox" else "--nri-max-containers",
            )
