"""koordqos.strategies: the QoS manager (strategy framework) and its strategies.

`build_qos_manager` builds every registered strategy (registry.py; CPUSuppress, CPUEvict, MemoryEvict, …)
into the `QoSManager` component, which subscribes each enabled one to metric ticks.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from koordqos.cgroups.executor import CgroupExecutor
    from koordqos.cgroups.layout import CgroupLayout
    from koordqos.cgroups.reader import CgroupReader
    from koordqos.config import AgentConfig
    from koordqos.decisions import DecisionLog
    from koordqos.events.bus import EventBus
    from koordqos.metrics.store import MetricStore
    from koordqos.metrics.topology import CpuTopology
    from koordqos.strategies.framework import Evictor, QoSManager


@dataclass(frozen=True)
class _Wiring:
    config: AgentConfig
    bus: EventBus
    decisions: DecisionLog
    status: MutableMapping[str, Any]
    services: dict[str, Any]


def build_qos_manager(
    *,
    config: AgentConfig,
    bus: EventBus,
    decisions: DecisionLog,
    status: MutableMapping[str, Any],
    layout: CgroupLayout,
    reader: CgroupReader,
    executor: CgroupExecutor,
    metric_store: MetricStore,
    topology: CpuTopology,
    evictor: Evictor | None,
    recorder: Any = None,  # the (rate-limited) Event recorder, cluster mode only
) -> QoSManager:
    """The QoS manager component over every registered strategy."""
    from koordqos.strategies.framework import QoSManager
    from koordqos.strategies.registry import build_all

    # StrategyEnv still looks its dependencies up by name; the names stay private to this package
    services: dict[str, Any] = {
        "cgroup_layout": layout,
        "cgroup_reader": reader,
        "executor": executor,
        "metric_store": metric_store,
        "topology": topology,
        "evictor": evictor,
        "event_recorder": recorder,
    }
    return QoSManager(_Wiring(config, bus, decisions, status, services), build_all())
