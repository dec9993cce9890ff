"""koordqos.metrics: node/pod/container sampling, CPU topology and the in-memory time-series store.

Services put on the AgentContext by `setup` (after koordqos.cgroups.setup):
* "topology": `CpuTopology` read from --sys-root
* "metric_store": `MetricStore` (retention --metrics-retention-seconds)
* "collector": `MetricsCollector`, also returned as the component that publishes a `MetricTick`
  (sample = `MetricSnapshot`) every --collect-interval
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component

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
    "setup",
]


def setup(ctx: AgentContext) -> list[Component]:
    """Build topology, store and collector from the cgroup services; return the collector component."""
    from koordqos.cgroups import CgroupLayout, CgroupReader

    cfg = ctx.config
    layout = ctx.services.get("cgroup_layout")
    if layout is None:  # metrics without the cgroups package (tests): detect here
        layout = CgroupLayout.detect(
            cfg.paths.cgroup_root, proc_root=cfg.paths.proc_root, sys_root=cfg.paths.sys_root
        )
        ctx.services["cgroup_layout"] = layout
    reader = ctx.services.get("cgroup_reader")
    if reader is None:
        reader = ctx.services["cgroup_reader"] = CgroupReader(layout)
    topology = read_topology(cfg.paths.sys_root)
    store = MetricStore(cfg.metrics.retention_seconds, cfg.metrics.collect_interval_seconds)
    collector = MetricsCollector(
        ctx.bus,
        layout,
        reader,
        store,
        proc_root=cfg.paths.proc_root,
        topology=topology,
        interval=cfg.metrics.collect_interval_seconds,
    )
    ctx.services["topology"] = topology
    ctx.services["metric_store"] = store
    ctx.services["collector"] = collector
    return [collector]
