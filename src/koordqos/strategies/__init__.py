"""koordqos.strategies: the QoS manager (strategy framework) and its strategies.

`setup(ctx)` builds every registered strategy (registry.py; CPUSuppress, CPUEvict, MemoryEvict, …) and
returns the `QoSManager` component, which subscribes each enabled one to metric ticks. Strategies read
and act through one typed `StrategyEnv` (layout, reader, executor, metric store, topology, host
actuator, evictor), built here from the services of the earlier packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component


def setup(ctx: AgentContext) -> list[Component]:
    """Contribute the QoS manager component."""
    from koordqos.strategies.framework import QoSManager, StrategyEnv
    from koordqos.strategies.registry import build_all

    s = ctx.services
    env = StrategyEnv(
        config=ctx.config,
        decisions=ctx.decisions,
        layout=s["cgroup_layout"],
        reader=s["cgroup_reader"],
        executor=s["executor"],
        store=s["metric_store"],
        host=s["host_actuator"],
        topology=s.get("topology"),
        evictor=s.get("evictor"),
    )
    manager = QoSManager(env, ctx.bus, build_all(), status=ctx.status)
    ctx.services["qos_manager"] = manager
    return [manager]
