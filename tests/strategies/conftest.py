"""Builders shared by the strategy tests: pods, nodes, NodeSLOs and a metric store with a fixed clock; the
CPU burst strategy harness fixture (its builders are in cpuburst_builders.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO, parse_nodeslo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS

from .cpuburst_builders import Harness, build_harness

NOW = 1000.0
Gi = 1024**3


def make_pod(
    name: str,
    qos: str | None = None,
    priority: int | None = None,
    requests: Mapping[str, int] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Running",
    kube_qos: KubeQoS = KubeQoS.BESTEFFORT,
) -> PodInfo:
    """A pod with one container `main` (uid = name)."""
    lab = dict(labels or {})
    if qos is not None:
        lab["koordinator.sh/qosClass"] = qos
    return PodInfo(
        uid=name,
        namespace="test-ns",
        name=name,
        labels=lab,
        annotations=dict(annotations or {}),
        phase=phase,
        kube_qos=kube_qos,
        priority=priority,
        containers=(ContainerInfo(name="main", requests=dict(requests or {}), limits=dict(requests or {})),),
    )


def make_node(
    cpu_cores: float = 100,
    memory: int = 120 * 10**9,
    allocatable: Mapping[str, int] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> NodeInfo:
    """A node with capacity (cpu in milli, memory in bytes) and allocatable = capacity + extras."""
    cap = {"cpu": int(cpu_cores * 1000), "memory": memory}
    alloc = dict(cap)
    alloc.update(allocatable or {})
    return NodeInfo(name="node-1", capacity=cap, allocatable=alloc, annotations=dict(annotations or {}))


def make_slo(**threshold: Any) -> NodeSLO:
    """A merged NodeSLO whose resourceUsedThresholdWithBE has `threshold` (camelCase keys)."""
    return parse_nodeslo({"spec": {"resourceUsedThresholdWithBE": threshold}})


def make_store(
    node_cpu: float | None = None,
    node_memory: float | None = None,
    pod_cpu: Mapping[str, float] | None = None,
    pod_memory: Mapping[str, float] | None = None,
) -> MetricStore:
    """A store holding one sample per given series at NOW, queried at NOW."""
    store = MetricStore(600, 1.0, clock=lambda: NOW)
    if node_cpu is not None:
        store.add(MetricKind.NODE_CPU_USAGE, "", node_cpu, NOW)
    if node_memory is not None:
        store.add(MetricKind.NODE_MEMORY_USAGE, "", node_memory, NOW)
    for uid, v in (pod_cpu or {}).items():
        store.add(MetricKind.POD_CPU_USAGE, uid, v, NOW)
    for uid, v in (pod_memory or {}).items():
        store.add(MetricKind.POD_MEMORY_USAGE, uid, v, NOW)
    return store


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    """A 16-CPU cgroup v1 synthetic node with cpu.cfs_burst_us (the CPU burst strategy tests)."""
    return build_harness(tmp_path)
