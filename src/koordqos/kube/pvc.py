"""PersistentVolumeClaims (docs/reconcile.md, "Blkio"; koordlet's `pvc` informer): which volume a claim is
bound to.

A blkio `podvolume` block names a pod's volume; a volume that is a claim resolves through the claim's
`spec.volumeName` to the PersistentVolume kubelet mounts at `.../volumes/kubernetes.io~csi/<pv>/mount`.
`VolumeClaimSource` keeps `namespace/claim → volumeName` of every bound claim and publishes
`VolumeClaimsReplaced` when it changes; `SourceSynced("pvcs")` after the first list. The reflector runs
with gate BlkIOReconcile only (the chart grants `persistentvolumeclaims` list/watch with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from koordqos.events.types import SourceSynced, VolumeClaimsReplaced
from koordqos.kube.watch import WatchEvent

if TYPE_CHECKING:
    from koordqos.bus import EventBus

PVCS_PATH = "/api/v1/persistentvolumeclaims"


def claim_binding(raw: Any) -> tuple[str, str] | None:
    """(`namespace/name`, the bound volume's name) of a raw claim; None when not a claim or not bound."""
    if not isinstance(raw, Mapping):
        return None
    meta, spec = raw.get("metadata"), raw.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    ns, name, volume = meta.get("namespace"), meta.get("name"), spec.get("volumeName")
    if not (isinstance(ns, str) and isinstance(name, str) and isinstance(volume, str)) or not (
        name and volume
    ):
        return None
    return f"{ns}/{name}", volume


class VolumeClaimSource:
    """Reflector handler of the claims."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.claims: dict[str, str] = {}
        self._published: dict[str, str] | None = None
        self._synced = False

    async def _publish(self) -> None:
        if self.claims != self._published:
            self._published = dict(self.claims)
            await self.bus.publish(VolumeClaimsReplaced(dict(self.claims)))
        if not self._synced:
            self._synced = True
            await self.bus.publish(SourceSynced("pvcs"))

    async def on_list(self, items: list[dict[str, Any]]) -> None:
        """The full set."""
        self.claims = dict(b for b in map(claim_binding, items) if b is not None)
        await self._publish()

    async def on_event(self, event: WatchEvent) -> None:
        """ADDED / MODIFIED bind (or unbind) a claim; DELETED forgets it."""
        meta = event.object.get("metadata") if isinstance(event.object, Mapping) else None
        if not isinstance(meta, Mapping):
            return
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        binding = None if event.type == "DELETED" else claim_binding(event.object)
        if binding is None:
            self.claims.pop(key, None)
        else:
            self.claims[binding[0]] = binding[1]
        await self._publish()

    async def on_absent(self) -> None:
        """Claims are always served."""
