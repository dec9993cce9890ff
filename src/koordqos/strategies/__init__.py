"""koordqos.strategies: the QoS manager (strategy framework) and its strategies.

`build_qos_manager` builds every registered strategy (registry.py; CPUSuppress, CPUEvict, MemoryEvict, …)
into the `QoSManager` component, which subscribes each enabled one to metric ticks. Strategies read and act
through one typed `StrategyEnv` (layout, reader, executor, metric store, topology, host actuator, evictor).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from koordqos.bus import EventBus
    from koordqos.cgroups.executor import CgroupExecutor
    from koordqos.cgroups.layout import CgroupLayout
    from koordqos.cgroups.reader import CgroupReader
    from koordqos.config import AgentConfig
    from koordqos.decisions import DecisionLog
    from koordqos.host import HostActuator
    from koordqos.metrics.store import MetricStore
    from koordqos.metrics.topology import CpuTopology
    from koordqos.strategies.framework import Evictor, QoSManager


def build_qos_manager(
    *,
    config: AgentConfig,
    bus: EventBus,
    decisions: DecisionLog,
    status: MutableMapping[str, Any],
    layout: CgroupLayout,
    reader: CgroupReader,
    executor: CgroupExecutor,
    host: HostActuator,
    metric_store: MetricStore,
    topology: CpuTopology | None,
    evictor: Evictor | None,
    recorder: Any = None,  # the (rate-limited) Event recorder, cluster mode only
    psi: Any = None,  # the PSI collector (gate PSICollector or PSIInterference)
    node_marker: Any = None,  # the Node condition/taint writer, cluster mode only
) -> QoSManager:
    """The QoS manager component over every registered strategy."""
    from koordqos.strategies.framework import QoSManager, StrategyEnv
    from koordqos.strategies.registry import build_all

    env = StrategyEnv(
        config=config,
        decisions=decisions,
        layout=layout,
        reader=reader,
        executor=executor,
        store=metric_store,
        host=host,
        topology=topology,
        evictor=evictor,
        events=recorder,
        psi=psi,
        node_marker=node_marker,
    )
    return QoSManager(env, bus, build_all(), status=status)
