"""koordqos.metrics: node/pod/container sampling, CPU topology and the in-memory time-series store.

The composer builds the `CpuTopology` (read from --sys-root), the `MetricStore` (retention
--metrics-retention-seconds) and the `MetricsCollector` component, which publishes a `MetricTick`
(sample = `MetricSnapshot`) every --collect-interval.
"""

from __future__ import annotations

from koordqos.metrics.collector import MetricsCollector
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import CpuInfo, CpuTopology, read_topology
from koordqos.metrics.types import (
    BESample,
    ContainerSample,
    MetricKind,
    MetricSnapshot,
    NodeSample,
    PodSample,
)

__all__ = [
    "BESample",
    "ContainerSample",
    "CpuInfo",
    "CpuTopology",
    "MetricKind",
    "MetricSnapshot",
    "MetricStore",
    "MetricsCollector",
    "NodeSample",
    "PodSample",
    "read_topology",
]
