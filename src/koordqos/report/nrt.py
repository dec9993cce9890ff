"""The NodeResourceTopology planner (docs/reporting.md, "Zones", "NRT writes"): node facts, pods and the
kubelet's CPU manager → the agent-owned part of the NRT (annotations, labels, topology policy, zones), the
merge onto the object in the cluster (keeping what others add) and the semantic change test that decides
whether to write. Pure: no I/O.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from koordqos.errors import ModelError
from koordqos.metrics.hardware import NodeHardware, NumaMemory
from koordqos.metrics.topology import CpuTopology
from koordqos.model.cpuset import format_cpuset
from koordqos.model.keys import ANNOTATION_RESOURCE_STATUS
from koordqos.model.node import NodeInfo
from koordqos.model.pod import PodInfo
from koordqos.model.qos import QoSClass
from koordqos.model.quantity import resource_value
from koordqos.model.wirevalue import FieldProblem, short
from koordqos.report.format import cpu_quantity, decimal_quantity, memory_quantity
from koordqos.report.kubelet import CheckpointState, KubeletCPUManager, policy_annotation
from koordqos.report.pools import (
    SharePools,
    pools_annotation,
    reservation_annotation,
    share_pools,
    system_qos_annotation,
)

Json = dict[str, Any]

API_VERSION = "topology.node.k8s.io/v1alpha1"
KIND = "NodeResourceTopology"
ANN_CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
ANN_CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
ANN_BE_CPU_SHARED_POOLS = "node.koordinator.sh/be-cpu-shared-pools"
ANN_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
ANN_POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
ANN_CPU_BASIC_INFO = "node.koordinator.sh/cpu-basic-info"
ANN_RESERVATION = "node.koordinator.sh/reservation"
ANN_SYSTEM_QOS = "node.koordinator.sh/system-qos-resource"
MANAGED_ANNOTATIONS = (
    ANN_CPU_TOPOLOGY,
    ANN_CPU_SHARED_POOLS,
    ANN_BE_CPU_SHARED_POOLS,
    ANN_CPU_MANAGER_POLICY,
    ANN_POD_CPU_ALLOCS,
    ANN_CPU_BASIC_INFO,
    ANN_RESERVATION,
    ANN_SYSTEM_QOS,
)
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NUMA_RESERVATION = "node.koordinator.sh/enable-numa-reservation"
MANAGED_RESOURCES = ("cpu", "memory", "koordinator.sh/gpu", "hugepages-2Mi", "hugepages-1Gi")
_KOORD_MANAGED_QOS = frozenset({QoSClass.LS, QoSClass.BE})


def _compact(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class NRTInputs:
    """Everything the NRT is computed from."""

    node_name: str
    node: NodeInfo | None
    topology: CpuTopology
    hardware: NodeHardware
    pods: tuple[PodInfo, ...]
    kubelet: KubeletCPUManager | None = None  # None: no kubelet source; kubelet keys are not updated
    checkpoint: CheckpointState | None = None
    hugepage_report: bool = False


@dataclass(frozen=True, slots=True)
class NRTDesired:
    """The agent-owned part of the NRT."""

    annotations: Mapping[str, str]
    labels: Mapping[str, str | None]  # None: remove the label
    topology_policies: tuple[str, ...]
    zones: tuple[Json, ...]
    pools: SharePools
    problems: tuple[str, ...] = field(default=())


def cpu_topology_annotation(topology: CpuTopology) -> str:
    """`cpu-topology` with lscpu-style node-wide core ids (docs/reporting.md): the next integer for each new
    (socket, core_id) pair, iterating CPUs by ascending id."""
    ids: dict[tuple[int, int], int] = {}
    detail = []
    for c in topology.cpus:
        core = ids.setdefault((c.socket, c.core), len(ids))
        detail.append({"id": c.cpu, "core": core, "socket": c.socket, "node": c.node})
    return _compact({"detail": detail})


def _kubelet_allocs(inp: NRTInputs) -> tuple[list[Json], set[int]]:
    """`pod-cpu-allocs` entries (kubelet-pinned pods Koordinator does not manage) and their CPUs."""
    state = inp.checkpoint
    if state is None or inp.kubelet is None or inp.kubelet.policy != "static":
        return [], set()
    by_uid = {p.uid: p for p in inp.pods}
    out: list[Json] = []
    cpus: set[int] = set()
    for uid, pinned in sorted(state.entries.items()):
        pod = by_uid.get(uid)
        if pod is not None and (pod.qos_raw in _KOORD_MANAGED_QOS or pod.cpuset):
            continue
        if not pinned:
            continue
        entry: Json = {}
        if pod is not None:
            entry["namespace"] = pod.namespace
            entry["name"] = pod.name
        entry["uid"] = uid
        entry["cpuset"] = format_cpuset(pinned)
        entry["managedByKubelet"] = True
        out.append(entry)
        cpus.update(pinned)
    return out, cpus


def _cpu_basic_info(hw: NodeHardware) -> str:
    info = hw.cpu
    doc: Json = {}
    if info.cpu_model:
        doc["cpuModel"] = info.cpu_model
    if info.hyper_thread_enabled:
        doc["hyperThreadEnabled"] = True
    if info.turbo_enabled:
        doc["turboEnabled"] = True
    if info.cat_l3_cbm_mask:
        doc["catL3CbmMask"] = info.cat_l3_cbm_mask
    if info.vendor_id:
        doc["vendorID"] = info.vendor_id
    return _compact(doc)


def _resource(name: str, capacity: str, allocatable: str | None = None) -> Json:
    alloc = capacity if allocatable is None else allocatable
    return {"name": name, "capacity": capacity, "allocatable": alloc, "available": alloc}


def _zones(inp: NRTInputs) -> tuple[Json, ...]:
    """One `Node` zone per NUMA node (docs/reporting.md, "Zones"); without NUMA information one zone with
    everything."""
    by_node = inp.topology.by_node()
    numa = dict(inp.hardware.numa)
    if not numa:
        total = inp.hardware.memory_total or 0
        numa_cpus = {0: tuple(sorted(inp.topology.cpu_ids))}
        numa = {0: NumaMemory(total)}
    else:
        if set(numa) != set(by_node):
            raise ModelError(
                f"NUMA nodes differ between memory ({sorted(numa)}) and CPU topology ({sorted(by_node)})"
            )
        numa_cpus = dict(by_node)
    reserve_cpu = reserve_mem = 0
    node = inp.node
    if node is not None and node.labels.get(LABEL_NUMA_RESERVATION) == "true" and numa:
        reserved = node.kubelet_reserved()
        reserve_cpu = math.ceil(reserved["cpu"] / len(numa))
        reserve_mem = math.ceil(reserved["memory"] / len(numa))
    zones = []
    for nid in sorted(numa):
        mem = numa[nid]
        hp2 = mem.hugepages_2mi if inp.hugepage_report else 0
        hp1 = mem.hugepages_1gi if inp.hugepage_report else 0
        memory = max(mem.total - hp2 - hp1, 0)
        cpu_milli = len(numa_cpus.get(nid, ())) * 1000
        resources = [
            _resource(
                "cpu", decimal_quantity(cpu_milli // 1000), cpu_quantity(max(cpu_milli - reserve_cpu, 0))
            ),
            _resource("hugepages-1Gi", memory_quantity(hp1)),
            _resource("hugepages-2Mi", memory_quantity(hp2)),
            _resource("memory", memory_quantity(memory), memory_quantity(max(memory - reserve_mem, 0))),
        ]
        zones.append({"name": f"node-{nid}", "type": "Node", "resources": resources})
    return tuple(sorted(zones, key=lambda z: str(z["name"])))


def desired(inp: NRTInputs) -> NRTDesired:
    """Compute the agent-owned NRT content; ModelError when the node facts contradict each other."""
    reservation, reserved_cpus = reservation_annotation(inp.node, inp.topology)
    system_qos, system_cpus = system_qos_annotation(inp.node)
    allocs, pinned = _kubelet_allocs(inp)
    pools = share_pools(
        inp.topology,
        inp.pods,
        kubelet_pinned=pinned,
        reserved_cpus=reserved_cpus,
        system_qos_cpus=system_cpus,
    )
    ann: dict[str, str] = {
        ANN_CPU_TOPOLOGY: cpu_topology_annotation(inp.topology),
        ANN_CPU_SHARED_POOLS: pools_annotation(pools.ls),
        ANN_BE_CPU_SHARED_POOLS: pools_annotation(pools.be),
        ANN_CPU_BASIC_INFO: _cpu_basic_info(inp.hardware),
        ANN_RESERVATION: _compact(reservation),
        ANN_SYSTEM_QOS: _compact(system_qos),
    }
    if inp.kubelet is not None:
        ann[ANN_CPU_MANAGER_POLICY] = policy_annotation(inp.kubelet)
        ann[ANN_POD_CPU_ALLOCS] = _compact(allocs or None)
    labels: dict[str, str | None] = {LABEL_NUMA_RESERVATION: None}
    if inp.node is not None and LABEL_NUMA_RESERVATION in inp.node.labels:
        labels[LABEL_NUMA_RESERVATION] = inp.node.labels[LABEL_NUMA_RESERVATION]
    policy = inp.kubelet.topology_policy if inp.kubelet is not None else "None"
    problems = tuple(f"pod {k}: {ANNOTATION_RESOURCE_STATUS}: {v}" for k, v in sorted(pools.problems.items()))
    return NRTDesired(ann, labels, (policy,), _zones(inp), pools, problems)


def skeleton(node_name: str, node_uid: str) -> Json:
    """The object koordlet creates, except that the ownerReference does not block owner deletion."""
    meta: Json = {"name": node_name, "labels": {LABEL_MANAGED_BY: "Koordinator"}}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "topologyPolicies": ["None"],
        "zones": [],
    }


def _merge_zones(current: list[Any], want: tuple[Json, ...]) -> list[Json]:
    """Drop zones no longer produced; in kept zones our resources replace same-named ones, others stay."""
    old = {str(z.get("name")): z for z in current if isinstance(z, Mapping)}
    out = []
    for zone in want:
        prev = old.get(str(zone["name"]))
        if prev is None:
            out.append(copy.deepcopy(zone))
            continue
        merged = copy.deepcopy(dict(prev))
        ours = {r["name"] for r in zone["resources"]}
        kept = [
            r for r in prev.get("resources") or [] if isinstance(r, Mapping) and r.get("name") not in ours
        ]
        merged["type"] = zone["type"]
        merged["resources"] = sorted(
            [*copy.deepcopy(kept), *copy.deepcopy(zone["resources"])], key=lambda r: str(r["name"])
        )
        out.append(merged)
    return sorted(out, key=lambda z: str(z["name"]))


def overlay(current: Mapping[str, Any], want: NRTDesired) -> Json:
    """The object to PUT: `current` (with its resourceVersion) with the agent-owned parts replaced."""
    obj = copy.deepcopy(dict(current))
    meta = obj.setdefault("metadata", {})
    ann = dict(meta.get("annotations") or {})
    ann.update(want.annotations)
    meta["annotations"] = ann
    labels = dict(meta.get("labels") or {})
    for key, value in want.labels.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    meta["labels"] = labels
    obj["topologyPolicies"] = list(want.topology_policies)
    obj["zones"] = _merge_zones(list(obj.get("zones") or []), want.zones)
    return obj


def _decoded(raw: Any) -> Any:
    if raw is None:
        return ("absent",)
    if not isinstance(raw, str):
        return ("invalid", short(raw))
    try:
        return json.loads(raw)
    except ValueError:
        return ("invalid", raw)


def _quantity(name: str, raw: Any) -> str:
    """A quantity as a comparable text: its value in the agent's unit, or the raw value marked invalid."""
    try:
        return str(resource_value(name, str(raw)))
    except (ModelError, TypeError, ValueError):
        return "invalid:" + short(raw)


def _zone_key(zone: Mapping[str, Any]) -> tuple[Any, ...]:
    res = {
        str(r.get("name")): tuple(
            _quantity(str(r.get("name")), r.get(k)) for k in ("capacity", "allocatable", "available")
        )
        for r in zone.get("resources") or []
        if isinstance(r, Mapping) and r.get("name") in MANAGED_RESOURCES
    }
    return (str(zone.get("name")), str(zone.get("type")), tuple(sorted(res.items())))


def _clean(value: Any) -> bool:
    """JSON the API server could have sent: no NaN or infinity anywhere (Go's encoder cannot write them)."""
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


def sanitized(current: Mapping[str, Any], problems: list[FieldProblem]) -> Json:
    """The NRT read from the API server with what no NRT can hold dropped (issue #39): non-string
    annotations and labels, zones and resources that are not objects or carry NaN/infinite numbers, parts of
    the wrong type. Each drop is a problem; what is dropped and ours is written again by the overlay."""
    obj = dict(current)
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        if meta is not None:
            problems.append(FieldProblem("metadata", "wrong type", short(meta), "an object"))
        meta = {}
    meta = dict(meta)
    for part in ("annotations", "labels"):
        raw = meta.get(part)
        if raw is None:
            continue
        if not isinstance(raw, Mapping):
            problems.append(FieldProblem(f"metadata.{part}", "wrong type", short(raw), "a map of strings"))
            meta[part] = {}
            continue
        kept = {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
        for k, v in raw.items():
            if k not in kept:
                where = f"metadata.{part}[{short(k)}]"
                problems.append(FieldProblem(where, "wrong type", short(v), "a string"))
        meta[part] = kept
    for key in [k for k, v in meta.items() if not _clean(v)]:
        problems.append(
            FieldProblem(f"metadata.{key}", "out of range", short(meta.pop(key)), "finite numbers")
        )
    obj["metadata"] = meta
    for key in [k for k, v in obj.items() if k not in ("metadata", "zones") and not _clean(v)]:
        problems.append(FieldProblem(str(key), "out of range", short(obj.pop(key)), "finite numbers"))
    policies = obj.get("topologyPolicies")
    if policies is not None and not (
        isinstance(policies, list) and all(isinstance(p, str) for p in policies)
    ):
        problems.append(FieldProblem("topologyPolicies", "wrong type", short(policies), "a list of strings"))
        obj["topologyPolicies"] = []
    zones = obj.get("zones")
    if zones is None:
        return obj
    if not isinstance(zones, list):
        problems.append(FieldProblem("zones", "wrong type", short(zones), "a list of zones"))
        obj["zones"] = []
        return obj
    out = []
    for i, zone in enumerate(zones):
        if not isinstance(zone, Mapping) or not isinstance(zone.get("name"), str):
            problems.append(FieldProblem(f"zones[{i}]", "wrong type", short(zone), "a zone with a name"))
            continue
        zone = dict(zone)
        resources = zone.get("resources")
        if resources is not None and not isinstance(resources, list):
            problems.append(FieldProblem(f"zones[{i}].resources", "wrong type", short(resources), "a list"))
            resources = []
        kept_resources = []
        for j, r in enumerate(resources or []):
            if isinstance(r, Mapping) and isinstance(r.get("name"), str) and _clean(r):
                kept_resources.append(r)
            else:
                where = f"zones[{i}].resources[{j}]"
                problems.append(
                    FieldProblem(where, "wrong type", short(r), "a resource with finite quantities")
                )
        if resources is not None:
            zone["resources"] = kept_resources
        if not _clean({k: v for k, v in zone.items() if k != "resources"}):
            problems.append(FieldProblem(f"zones[{i}]", "out of range", short(zone), "finite numbers"))
            continue
        out.append(zone)
    obj["zones"] = out
    return obj


def changed(current: Mapping[str, Any], want: NRTDesired) -> bool:
    """Whether the object in the cluster differs from what the agent wants (docs/reporting.md, "NRT
    writes")."""
    meta = current.get("metadata") or {}
    ann = meta.get("annotations") or {}
    for key, value in want.annotations.items():
        if _decoded(ann.get(key)) != _decoded(value):
            return True
    labels = meta.get("labels") or {}
    for key, lv in want.labels.items():
        if labels.get(key) != lv:
            return True
    if list(current.get("topologyPolicies") or []) != list(want.topology_policies):
        return True
    zones = [z for z in current.get("zones") or [] if isinstance(z, Mapping)]
    if len(zones) != len(want.zones):
        return True
    return sorted(map(_zone_key, zones)) != sorted(map(_zone_key, want.zones))


def modifier(
    want: NRTDesired, node_name: str, node_uid: str, problems: list[FieldProblem] | None = None
) -> Callable[[Mapping[str, Any] | None], Json | None]:
    """The read-modify-write step for the NRT writer: the skeleton with our parts when absent, the overlay
    when the object differs semantically, None when it is current. What the object in the cluster holds that
    no NRT can (`sanitized`) is dropped and listed in `problems`."""

    def modify(current: Mapping[str, Any] | None) -> Json | None:
        if current is None:
            return overlay(skeleton(node_name, node_uid), want)
        found: list[FieldProblem] = []
        clean = sanitized(current, found)
        if problems is not None:
            problems.extend(found)
        if found or changed(clean, want):
            return overlay(clean, want)
        return None

    return modify
