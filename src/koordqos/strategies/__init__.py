"""koordqos.strategies: the QoS manager (strategy framework) and its strategies.

`setup(ctx)` builds every registered strategy (registry.py; CPUSuppress, CPUEvict, MemoryEvict, …) and
returns the `QoSManager` component, which subscribes each enabled one to metric ticks. It reads the
services "metric_store", "topology", "cgroup_layout", "cgroup_reader", "executor", "evictor" and "host"
(made here when no other package provided it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component


def setup(ctx: AgentContext) -> list[Component]:
    """Contribute the QoS manager component (services are looked up when strategies run)."""
    from koordqos.host import HostActuator
    from koordqos.strategies.framework import QoSManager
    from koordqos.strategies.registry import build_all

    if "host" not in ctx.services:  # sysctl / sysfs / resctrl writes of the reconcile strategies
        paths = ctx.config.paths
        ctx.services["host"] = HostActuator(ctx.decisions, proc_root=paths.proc_root, sys_root=paths.sys_root)
    manager = QoSManager(ctx, build_all())
    ctx.services["qos_manager"] = manager
    return [manager]
