"""strategy_env: a StrategyEnv over one cgroup layout with real readers and actuators (tests, benches)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from koordqos.cgroups.executor import CgroupExecutor
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.config import AgentConfig
from koordqos.decisions import DecisionLog
from koordqos.host import HostActuator
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import CpuTopology
from koordqos.strategies.framework import Evictor, StrategyEnv


def strategy_env(
    layout: CgroupLayout,
    decisions: DecisionLog | None = None,
    *,
    config: AgentConfig | None = None,
    store: MetricStore | None = None,
    executor: CgroupExecutor | None = None,
    reader: CgroupReader | None = None,
    host: HostActuator | None = None,
    topology: CpuTopology | None = None,
    evictor: Evictor | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> StrategyEnv:
    """Every part not given is built over `layout` (the host actuator under the layout's proc/sys roots)."""
    decisions = DecisionLog() if decisions is None else decisions
    executor = CgroupExecutor(layout, decisions, clock=clock) if executor is None else executor
    return StrategyEnv(
        config=AgentConfig() if config is None else config,
        decisions=decisions,
        layout=layout,
        reader=CgroupReader(layout, dry_run_files=executor.dry_run_files) if reader is None else reader,
        executor=executor,
        store=MetricStore(600, 1.0, clock=clock) if store is None else store,
        host=HostActuator(decisions, proc_root=Path(layout.proc_root), sys_root=Path(layout.sys_root))
        if host is None
        else host,
        topology=topology,
        evictor=evictor,
        clock=clock,
    )
