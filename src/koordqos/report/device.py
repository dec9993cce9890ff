"""The node's `Device` object (`scheduling.koordinator.sh/v1alpha1`, named after the node): planner.

Built from a device scan (`metrics/devices.py`) as koordlet's `reportDevice` builds it:

* metadata: the node's name, an owner reference to the Node (controller, blockOwnerDeletion), and labels
  `node.koordinator.sh/gpu-vendor`, `gpu-model`, `gpu-driver-version` (NVML) or the device-info files'
  vendor and model (and `gpu-partition-policy` Prefer / Honor when they list P2P links, with the partition
  table in `scheduling.koordinator.sh/gpu-partitions`);
* `spec.devices`: `{id, minor, type: gpu, health, resources, topology{socketID: -1, nodeID, pcieID, busID},
  conditions}`; NVML GPUs carry `koordinator.sh/gpu-core` 100, `gpu-memory` (the GPU's memory) and
  `gpu-memory-ratio` 100; device-info files their own resources plus `gpu-memory-ratio` 100 (`gpu-core` and
  `gpu-memory` get the `koordinator.sh/` prefix); a device with a status gets the `Healthy` condition.

Project decision (docs/devices.md): a node without devices writes no Device (koordlet creates an empty one);
`--device-report-empty` gives koordlet's behaviour. `merge_device` is the writer's read-modify-write: None
when the object already says the same (lastTransitionTime aside), else the body to write, keeping a
condition's lastTransitionTime while its status is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from koordqos.errors import ModelError
from koordqos.metrics.devices import DeviceScan, DeviceStatus, GPUDevice, XPUDevice
from koordqos.model.devices import (
    GPU_VENDOR_NVIDIA,
    LABEL_GPU_DRIVER_VERSION,
    LABEL_GPU_MODEL,
    LABEL_GPU_VENDOR,
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
)
from koordqos.model.quantity import parse_quantity
from koordqos.report.format import memory_quantity

API_VERSION = "scheduling.koordinator.sh/v1alpha1"
LABEL_GPU_PARTITION_POLICY = "node.koordinator.sh/gpu-partition-policy"
ANNOTATION_GPU_PARTITIONS = "scheduling.koordinator.sh/gpu-partitions"
CONDITION_HEALTHY = "Healthy"

Json = dict[str, Any]


def _condition(status: DeviceStatus | None, now: str) -> list[Json]:
    if status is None:
        return []
    if status.healthy:
        return [
            {
                "type": CONDITION_HEALTHY,
                "status": "True",
                "lastTransitionTime": now,
                "reason": "DeviceHealthy",
                "message": "device is healthy",
            }
        ]
    return [
        {
            "type": CONDITION_HEALTHY,
            "status": "False",
            "lastTransitionTime": now,
            "reason": status.err_code or "Unknown",
            "message": status.err_message or "device is unhealthy",
        }
    ]


def gpu_entry(gpu: GPUDevice, now: str) -> Json:
    """An NVML GPU's `spec.devices` entry."""
    entry: Json = {
        "id": gpu.uuid,
        "minor": gpu.minor,
        "type": "gpu",
        "health": gpu.status is None or gpu.status.healthy,
        "resources": {
            RESOURCE_GPU_CORE: "100",
            RESOURCE_GPU_MEMORY: memory_quantity(gpu.memory_total),
            RESOURCE_GPU_MEMORY_RATIO: "100",
        },
    }
    if gpu.node_id >= 0 and gpu.pcie and gpu.bus_id:
        entry["topology"] = {"socketID": -1, "nodeID": gpu.node_id, "pcieID": gpu.pcie, "busID": gpu.bus_id}
    conditions = _condition(gpu.status, now)
    if conditions:
        entry["conditions"] = conditions
    return entry


def xpu_entry(xpu: XPUDevice, now: str, problems: dict[str, str]) -> Json:
    """A device-info file's device as a `spec.devices` entry (bad resources: problems, left out)."""
    try:
        minor = int(xpu.minor)
    except ValueError:
        problems[f"xpu:{xpu.uuid}:minor"] = f"minor {xpu.minor!r} is not a number"
        minor = 0
    resources = {RESOURCE_GPU_MEMORY_RATIO: "100"}
    for name, qty in xpu.resources.items():
        try:
            parse_quantity(qty)
        except ModelError as exc:
            problems[f"xpu:{xpu.uuid}:{name}"] = str(exc)
            continue
        key = f"koordinator.sh/{name}" if name in ("gpu-core", "gpu-memory") else name
        resources[key] = qty
    entry: Json = {
        "id": xpu.uuid,
        "minor": minor,
        "type": "gpu",
        "health": xpu.status is None or xpu.status.healthy,
        "resources": resources,
    }
    if xpu.has_topology:
        node = int(xpu.node_id) if xpu.node_id.lstrip("-").isdigit() else -1
        entry["topology"] = {"socketID": -1, "nodeID": node, "pcieID": xpu.pcie_id, "busID": xpu.bus_id}
    conditions = _condition(xpu.status, now)
    if conditions:
        entry["conditions"] = conditions
    return entry


def partition_table(xpus: list[XPUDevice]) -> dict[str, list[Json]]:
    """The GPU partitions the P2P links describe, by size (koordlet's GPUPartitionTable)."""
    table: dict[int, list[Json]] = {}
    seen: set[tuple[int, ...]] = set()
    for xpu in xpus:
        for peers, kind in xpu.p2p_links:
            if not peers or not kind:
                continue
            minors = set()
            for m in [*peers.split(","), xpu.minor]:
                if m.strip().isdigit():
                    minors.add(int(m))
            key = tuple(sorted(minors))
            if key in seen:
                continue
            seen.add(key)
            table.setdefault(len(key), []).append(
                {"minors": list(key), "gpuLinkType": kind, "allocationScore": 1}
            )
    return {str(size): table[size] for size in sorted(table)}


def device_object(
    node_name: str, node_uid: str, scan: DeviceScan, now: str, *, report_empty: bool = False
) -> tuple[Json | None, dict[str, str]]:
    """(the Device to write, or None when the node has no device; the problems met)."""
    problems: dict[str, str] = {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    devices: list[Json] = []
    if scan.xpus:
        devices = sorted((xpu_entry(x, now, problems) for x in scan.xpus), key=lambda d: str(d["id"]))
        first = scan.xpus[0]
        labels = {LABEL_GPU_MODEL: first.model, LABEL_GPU_VENDOR: first.vendor}
        if first.p2p_links:
            labels[LABEL_GPU_PARTITION_POLICY] = "Honor" if first.must_honor_partition else "Prefer"
        table = partition_table(scan.xpus)
        if table:
            annotations[ANNOTATION_GPU_PARTITIONS] = json.dumps(table, separators=(",", ":"))
    elif scan.gpus:
        devices = [gpu_entry(g, now) for g in scan.gpus]
        labels = {LABEL_GPU_VENDOR: GPU_VENDOR_NVIDIA}
        if scan.gpu_model:
            labels[LABEL_GPU_MODEL] = scan.gpu_model
        if scan.gpu_driver:
            labels[LABEL_GPU_DRIVER_VERSION] = scan.gpu_driver
    if not devices and not report_empty:
        return None, problems
    devices.sort(key=lambda d: (str(d["type"]), int(d["minor"])))
    meta: Json = {
        "name": node_name,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": API_VERSION,
        "kind": "Device",
        "metadata": meta,
        "spec": {"devices": devices},
    }, problems


def _without_times(devices: Any) -> Any:
    out = []
    for d in devices or ():
        d = dict(d)
        if d.get("conditions"):
            d["conditions"] = [
                {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in d["conditions"]
            ]
        out.append(d)
    return sorted(out, key=lambda d: (str(d.get("type")), int(d.get("minor") or 0)))


def merge_device(current: Mapping[str, Any] | None, desired: Json) -> Json | None:
    """The body to write over `current` (None: `current` already says it all)."""
    if current is None:
        return desired
    meta = current.get("metadata") or {}
    spec = current.get("spec") or {}
    want_meta = desired["metadata"]
    want_devices = desired["spec"]["devices"]
    if (
        _without_times(spec.get("devices")) == _without_times(want_devices)
        and (meta.get("labels") or {}) == want_meta.get("labels", {})
        and (meta.get("annotations") or {}) == want_meta.get("annotations", {})
    ):
        return None
    old: dict[tuple[str, str], Json] = {}
    for d in spec.get("devices") or ():
        for c in d.get("conditions") or ():
            old[(str(d.get("id")), str(c.get("type")))] = c
    devices = []
    for d in want_devices:
        d = dict(d)
        if d.get("conditions"):
            kept = []
            for c in d["conditions"]:
                prev = old.get((str(d["id"]), c["type"]))
                if prev is not None and prev.get("status") == c["status"] and prev.get("lastTransitionTime"):
                    c = {**c, "lastTransitionTime": prev["lastTransitionTime"]}
                kept.append(c)
            d["conditions"] = kept
        devices.append(d)
    body = dict(current)
    new_meta = {k: v for k, v in meta.items() if k not in ("labels", "annotations", "managedFields")}
    if want_meta.get("labels"):
        new_meta["labels"] = want_meta["labels"]
    if want_meta.get("annotations"):
        new_meta["annotations"] = want_meta["annotations"]
    body["metadata"] = new_meta
    body["spec"] = {**spec, "devices": devices}
    return body
