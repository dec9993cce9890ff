"""NRI call records: what the NRI adapter reads (decoded protobufs) and fills in (the reply).

The plugin turns every NRI call into one record and hands it, inside the hook core's `run_call` (deadline,
failure policy), to its handler (`koordqos.nri.convert.NRIHooks` in the agent):

* read the request: `event.pod` (`PodSandbox`), `event.container` (`Container`), and for updates
  `event.linux_resources` (`LinuxResources`, the resources the runtime is about to apply);
* fill the reply: `event.adjust` (CreateContainer: a `ContainerAdjustment` protobuf, edited in place, e.g.
  `event.adjust.linux.resources.cpu.shares.value = 2`) and `event.updates` (a list of `ContainerUpdate`
  for *other* containers on CreateContainer; for any container, including the one being updated, on
  UpdateContainer, StopContainer and Synchronize). `event.update_for(container_id)` returns the update for
  that container, creating it on first use, so several steps merge into one entry.

With nothing filled in the replies are correctly empty. Updates whose resources stay empty are left out of
the reply; on CreateContainer an update naming the container being created is dropped (the runtime would
fail the creation). The request protobufs must be treated as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from koordqos.nri.api import nri_api_pb2 as api

# The longest the Synchronize path (decoding, records, hooks, reply, release) runs between two yields to the
# event loop: 1 ms, so that a slice, what it overruns by and a collection inside it stay under the 5 ms step
# budget on a loaded machine (2 ms gave 4–6 ms steps).
SYNC_SLICE_SECONDS = 0.001

__all__ = [
    "NRICall",
    "NRIContainerEvent",
    "NRICreateContainer",
    "NRIPodEvent",
    "NRIRemoveContainer",
    "NRIRemovePodSandbox",
    "NRIRunPodSandbox",
    "NRIStartContainer",
    "NRIStopContainer",
    "NRIStopPodSandbox",
    "NRISynchronize",
    "NRIUpdateContainer",
    "UpdatesMixin",
]


class NRICall:
    """Base of the NRI call records."""

    __slots__ = ()


class UpdatesMixin:
    """Reply field shared by events that may request updates of existing containers."""

    __slots__ = ()
    updates: list[api.ContainerUpdate]
    # container id -> its (first) entry in `updates`, for the first `_indexed` entries: a Synchronize asks
    # for thousands, and a scan per lookup made it quadratic
    _index: dict[str, api.ContainerUpdate]
    _indexed: int

    def update_for(self, container_id: str) -> api.ContainerUpdate:
        """The update for `container_id` in `self.updates`, appended on first use (`updates` is only ever
        appended to)."""
        index = self._index
        upd = index.get(container_id)
        if upd is not None:
            return upd
        updates = self.updates
        if self._indexed < len(updates):  # entries appended directly since the last lookup
            for u in updates[self._indexed :]:
                index.setdefault(u.container_id, u)
            self._indexed = len(updates)  # type: ignore[misc]  # a field of each dataclass using the mixin
            upd = index.get(container_id)
            if upd is not None:
                return upd
        upd = index[container_id] = api.ContainerUpdate(container_id=container_id)
        updates.append(upd)
        self._indexed += 1  # type: ignore[misc]
        return upd

    def drop_index(self) -> None:
        """Forget the lookup index of `updates` (it holds each update too; done before they are released)."""
        self._index.clear()
        self._indexed = 0  # type: ignore[misc]  # a field of each dataclass using the mixin

    def effective_updates(self) -> list[api.ContainerUpdate]:
        """The updates that change something (an id and at least one resource field set)."""
        return [u for u in self.updates if u.container_id and u.linux.resources.ByteSize() > 0]


@dataclass(slots=True, eq=False)
class NRIPodEvent(NRICall):
    """A pod-level lifecycle call; `pod` is the runtime's view of the sandbox."""

    pod: api.PodSandbox


@dataclass(slots=True, eq=False)
class NRIRunPodSandbox(NRIPodEvent):
    """RunPodSandbox (dedicated RPC or StateChange RUN_POD_SANDBOX). Notification: hooks act directly."""


@dataclass(slots=True, eq=False)
class NRIStopPodSandbox(NRIPodEvent):
    """StopPodSandbox. Notification."""


@dataclass(slots=True, eq=False)
class NRIRemovePodSandbox(NRIPodEvent):
    """RemovePodSandbox. Notification; the sandbox leaves NodeState after the hooks ran."""


@dataclass(slots=True, eq=False)
class NRIContainerEvent(NRICall):
    """A container-level lifecycle call; `pod` may be an empty PodSandbox when the runtime sent none."""

    pod: api.PodSandbox
    container: api.Container


@dataclass(slots=True, eq=False)
class NRICreateContainer(NRIContainerEvent, UpdatesMixin):
    """CreateContainer: fill `adjust` (this container) and `updates` (other, existing containers)."""

    adjust: api.ContainerAdjustment = field(default_factory=api.ContainerAdjustment)
    updates: list[api.ContainerUpdate] = field(default_factory=list)
    _index: dict[str, api.ContainerUpdate] = field(default_factory=dict, repr=False, compare=False)
    _indexed: int = field(default=0, repr=False, compare=False)


@dataclass(slots=True, eq=False)
class NRIStartContainer(NRIContainerEvent):
    """StartContainer (`phase="start"`) or PostStartContainer (`"post_start"`, pid known). Notification."""

    phase: Literal["start", "post_start"] = "post_start"


@dataclass(slots=True, eq=False)
class NRIUpdateContainer(NRIContainerEvent, UpdatesMixin):
    """UpdateContainer: `linux_resources` is what the runtime will apply; the entry for this container in
    `updates` is merged over it by the runtime (the plugin's fields win)."""

    linux_resources: api.LinuxResources = field(default_factory=api.LinuxResources)
    updates: list[api.ContainerUpdate] = field(default_factory=list)
    _index: dict[str, api.ContainerUpdate] = field(default_factory=dict, repr=False, compare=False)
    _indexed: int = field(default=0, repr=False, compare=False)


@dataclass(slots=True, eq=False)
class NRIStopContainer(NRIContainerEvent, UpdatesMixin):
    """StopContainer: `updates` for the remaining containers (applied after the stop)."""

    updates: list[api.ContainerUpdate] = field(default_factory=list)
    _index: dict[str, api.ContainerUpdate] = field(default_factory=dict, repr=False, compare=False)
    _indexed: int = field(default=0, repr=False, compare=False)


@dataclass(slots=True, eq=False)
class NRIRemoveContainer(NRIContainerEvent):
    """RemoveContainer. Notification; the container leaves NodeState after the hooks ran."""


@dataclass(slots=True, eq=False)
class NRISynchronize(NRICall, UpdatesMixin):
    """Synchronize (after every (re)connect): the union of all chunks; fill `updates` to correct any
    existing container. `reconnect` is true for every sync after the first one of this process. Valid for
    the call: after the reply its lists are emptied a slice per loop step (thousands of messages freed at
    once were one long step), so a hook copies what it needs to keep."""

    pods: list[api.PodSandbox] = field(default_factory=list)
    containers: list[api.Container] = field(default_factory=list)
    updates: list[api.ContainerUpdate] = field(default_factory=list)
    reconnect: bool = False
    _index: dict[str, api.ContainerUpdate] = field(default_factory=dict, repr=False, compare=False)
    _indexed: int = field(default=0, repr=False, compare=False)
