"""The LS and BE CPU share pools and the resolved reserved CPUs (docs/reporting.md, "Share pools and reserved
CPUs").

One computation serves both the NRT annotations (`cpu-shared-pools`, `be-cpu-shared-pools`) and the
CPUSetAllocator hook. Pure: pods, node annotations and kubelet allocations in, pools out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from koordqos.errors import ModelError
from koordqos.metrics.topology import CpuTopology
from koordqos.model import jsontext
from koordqos.model.cpuset import format_cpuset, parse_cpuset
from koordqos.model.keys import ANNOTATION_RESOURCE_STATUS
from koordqos.model.node import ANNOTATION_NODE_RESERVATION, ANNOTATION_SYSTEM_QOS_RESOURCE, NodeInfo
from koordqos.model.pod import PodInfo
from koordqos.model.qos import QoSClass
from koordqos.model.quantity import to_milli


@dataclass(frozen=True, slots=True)
class SharePool:
    """One NUMA node's part of a share pool (`CPUSharedPool`: socket, node, cpuset)."""

    socket: int
    node: int
    cpuset: str

    def json(self) -> dict[str, Any]:
        """Go field order; `cpuset` omitted when empty (omitempty)."""
        out: dict[str, Any] = {"socket": self.socket, "node": self.node}
        if self.cpuset:
            out["cpuset"] = self.cpuset
        return out


@dataclass(frozen=True, slots=True)
class SharePools:
    """The result: LS and BE pools, the reserved/system CPUs taken out, pods that were ignored."""

    ls: tuple[SharePool, ...]
    be: tuple[SharePool, ...]
    reserved_cpus: tuple[int, ...] = ()
    problems: Mapping[str, str] = field(default_factory=dict)  # pod key → why its cpuset was ignored


def take_by_topology(
    topology: CpuTopology, count: int, available: Iterable[int] | None = None
) -> tuple[int, ...]:
    """Pick `count` CPUs like the kubelet's `takeByTopology`: whole sockets, then whole physical cores,
    then single threads; lowest ids first."""
    free = set(topology.cpu_ids if available is None else available)
    picked: list[int] = []

    def need() -> int:
        return count - len(picked)

    sockets: dict[int, list[int]] = {}
    for c in topology.cpus:
        sockets.setdefault(c.socket, []).append(c.cpu)
    for _, cpus in sorted(sockets.items()):
        if need() >= len(cpus) and all(c in free for c in cpus):
            picked.extend(cpus)
            free.difference_update(cpus)
    for core in topology.by_core().values():
        if need() >= len(core) > 0 and all(c in free for c in core):
            picked.extend(core)
            free.difference_update(core)
    for cpu in sorted(free):
        if need() <= 0:
            break
        picked.append(cpu)
    return tuple(sorted(picked[: max(count, 0)]))


def reservation_annotation(
    node: NodeInfo | None, topology: CpuTopology
) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The Node's `node.koordinator.sh/reservation` re-serialised with `reservedCPUs` resolved to ids, and
    those ids; an absent or unparsable annotation is `{}`."""
    raw = (node.annotations if node is not None else {}).get(ANNOTATION_NODE_RESERVATION)
    if not raw:
        return {}, ()
    try:
        doc = jsontext.loads(raw)
        if not isinstance(doc, dict):
            return {}, ()
        cpus_text = doc.get("reservedCPUs") or ""
        cpus = parse_cpuset(str(cpus_text)) if cpus_text else ()
        if not cpus:
            resources = doc.get("resources") or {}
            milli = (
                to_milli(str(resources["cpu"])) if isinstance(resources, dict) and "cpu" in resources else 0
            )
            if milli > 0:
                cpus = take_by_topology(topology, math.ceil(milli / 1000))
        if cpus:
            doc["reservedCPUs"] = format_cpuset(cpus)
        return doc, cpus
    except (ValueError, ModelError, TypeError):
        return {}, ()


def system_qos_annotation(node: NodeInfo | None) -> tuple[dict[str, Any], tuple[int, ...]]:
    """A copy of the Node's `system-qos-resource` (`{}` when absent or malformed) and its exclusive CPUs."""
    raw = (node.annotations if node is not None else {}).get(ANNOTATION_SYSTEM_QOS_RESOURCE)
    if not raw:
        return {}, ()
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        return {}, ()
    if not isinstance(doc, dict):
        return {}, ()
    sq = node.system_qos_resource if node is not None else None
    if sq is None or not sq.cpuset_exclusive:
        return doc, ()
    return doc, sq.cpuset


def _group(topology: CpuTopology, cpus: set[int]) -> tuple[SharePool, ...]:
    by_node: dict[int, list[int]] = {}
    socket_of: dict[int, int] = {}
    for c in topology.cpus:  # ascending id: the socket comes from the group's first CPU
        if c.cpu in cpus:
            by_node.setdefault(c.node, []).append(c.cpu)
            socket_of.setdefault(c.node, c.socket)
    pools = [SharePool(socket_of[n], n, format_cpuset(ids)) for n, ids in by_node.items()]
    return tuple(sorted(pools, key=lambda p: (p.socket, p.node)))


def share_pools(
    topology: CpuTopology,
    pods: Iterable[PodInfo],
    *,
    kubelet_pinned: Iterable[int] = (),
    reserved_cpus: Iterable[int] = (),
    system_qos_cpus: Iterable[int] = (),
) -> SharePools:
    """docs/reporting.md "Share pools and reserved CPUs", steps 1–5. `kubelet_pinned`: CPUs of kubelet
    static-policy pods (pass () unless the policy is static); Succeeded/Failed pods are skipped (their CPUs
    are free again)."""
    all_cpus = set(topology.cpu_ids)
    ls = all_cpus - set(kubelet_pinned)
    be = set(ls)
    problems: dict[str, str] = {}
    for pod in pods:
        if pod.terminated:
            continue
        raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
        if not raw:
            continue
        status = pod.resource_status
        if status is None:
            problems[pod.key] = pod.problems.get(ANNOTATION_RESOURCE_STATUS, "invalid resource-status")
            continue
        if not status.cpuset:
            continue
        cpus = set(status.cpus)
        ls -= cpus
        if pod.qos_raw is QoSClass.LSE:
            be -= cpus
    reserved = tuple(sorted(set(reserved_cpus)))
    for cpus in (set(reserved), set(system_qos_cpus)):
        ls -= cpus
        be -= cpus
    return SharePools(_group(topology, ls), _group(topology, be), reserved, problems)


def pools_annotation(pools: tuple[SharePool, ...]) -> str:
    """The JSON of `cpu-shared-pools` / `be-cpu-shared-pools`."""
    return json.dumps([p.json() for p in pools], separators=(",", ":"))
