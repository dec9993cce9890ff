"""Device names and the scheduler's device allocation of a pod (`scheduling.koordinator.sh/device-allocated`).

Pure. The annotation is `{"<type>": [{"minor": n, "resources": {...}, "id": "<pci>", "extension": {"vfs":
[{"minor": n, "busID": "<pci>"}]}}]}` with the device types of `scheduling.koordinator.sh/v1alpha1`
(`gpu`, `rdma`, `fpga`, `xpu`…); `device_allocations` raises ModelError on anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from koordqos.errors import ModelError
from koordqos.model import jsontext
from koordqos.model.quantity import to_int

ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
LABEL_GPU_ISOLATION_PROVIDER = "koordinator.sh/gpu-isolation-provider"
HAMI_CORE = "HAMi-core"
GPU = "gpu"
RDMA = "rdma"
RESOURCE_GPU_CORE = "koordinator.sh/gpu-core"
RESOURCE_GPU_MEMORY = "koordinator.sh/gpu-memory"
RESOURCE_GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
RESOURCE_RDMA = "koordinator.sh/rdma"
LABEL_GPU_VENDOR = "node.koordinator.sh/gpu-vendor"
LABEL_GPU_MODEL = "node.koordinator.sh/gpu-model"
LABEL_GPU_DRIVER_VERSION = "node.koordinator.sh/gpu-driver-version"
GPU_VENDOR_NVIDIA = "nvidia"


@dataclass(frozen=True, slots=True)
class VirtualFunction:
    """An SR-IOV virtual function the scheduler gave the pod."""

    bus_id: str
    minor: int = 0


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One allocated device: its minor, the resources taken from it (whole units), its id and VFs."""

    minor: int
    resources: Mapping[str, int]
    id: str = ""
    vfs: tuple[VirtualFunction, ...] = ()


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: {what} must be an integer")
    return value


def _allocation(raw: object, kind: str) -> DeviceAllocation:
    if not isinstance(raw, dict):
        raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: {kind}: expected objects")
    resources: dict[str, int] = {}
    for name, qty in (raw.get("resources") or {}).items():
        if not isinstance(qty, str | int) or isinstance(qty, bool):
            raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: {kind}: {name}: not a quantity")
        resources[str(name)] = to_int(qty)
    ext = raw.get("extension") or {}
    if not isinstance(ext, dict):
        raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: {kind}: extension must be an object")
    vfs = []
    for vf in ext.get("vfs") or ():
        if not isinstance(vf, dict) or not isinstance(vf.get("busID", ""), str):
            raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: {kind}: bad vf {vf!r:.64}")
        vfs.append(VirtualFunction(vf.get("busID", ""), _int(vf.get("minor", 0), "vf minor")))
    ident = raw.get("id", "")
    if not isinstance(ident, str):
        raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: {kind}: id must be a string")
    return DeviceAllocation(_int(raw.get("minor", 0), "minor"), resources, ident, tuple(vfs))


def device_allocations(annotations: Mapping[str, str]) -> dict[str, tuple[DeviceAllocation, ...]]:
    """The pod's allocation by device type ({} without the annotation); ModelError when malformed."""
    raw = annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if raw is None:
        return {}
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: invalid JSON {raw[:64]!r}") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: expected an object")
    out: dict[str, tuple[DeviceAllocation, ...]] = {}
    for kind, items in doc.items():
        if items is None:
            continue
        if not isinstance(items, list):
            raise ModelError(f"{ANNOTATION_DEVICE_ALLOCATED}: {kind}: expected a list")
        out[str(kind)] = tuple(_allocation(i, str(kind)) for i in items)
    return out
