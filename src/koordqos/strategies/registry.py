"""Strategy registry: name → factory, in the fixed set-up/start order of spec §1.1 (project decision)."""

from __future__ import annotations

from collections.abc import Callable

from koordqos.strategies.framework import QoSStrategy

Factory = Callable[[], QoSStrategy]

_REGISTRY: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Register a strategy factory under `name` (a duplicate name is a programming error)."""
    if name in _REGISTRY:
        raise ValueError(f"strategy {name!r} already registered")
    _REGISTRY[name] = factory


def registered() -> list[str]:
    """Registered names, in start order."""
    return [n for n in ORDER if n in _REGISTRY] + sorted(n for n in _REGISTRY if n not in ORDER)


def build_all() -> list[QoSStrategy]:
    """One instance of every registered strategy, in start order."""
    return [_REGISTRY[n]() for n in registered()]


# koordlet's table order (BlkioReconcile, CgroupReconcile, CPUBurst, CPUEvict, CPUSuppress, MemoryEvict, …)
ORDER = (
    "BlkioReconcile",
    "CgroupReconcile",
    "CPUBurst",
    "CPUEvict",
    "CPUSuppress",
    "MemoryEvict",
    "ResctrlReconcile",
    "SystemConfigReconcile",
    "PSIInterference",  # koordqos's own (docs/psi.md), after koordlet's
)


def _register_builtin() -> None:
    from koordqos.strategies.blkio import BlkioReconcileStrategy
    from koordqos.strategies.cpuburst import CPUBurstStrategy
    from koordqos.strategies.cpuevict import CPUEvictStrategy
    from koordqos.strategies.cpusuppress import CPUSuppressStrategy
    from koordqos.strategies.memoryevict import MemoryEvictStrategy
    from koordqos.strategies.memoryqos import CgroupReconcileStrategy
    from koordqos.strategies.psirule import PSIInterferenceStrategy
    from koordqos.strategies.resctrl import ResctrlReconcileStrategy
    from koordqos.strategies.sysconfig import SystemConfigStrategy

    register("BlkioReconcile", BlkioReconcileStrategy)
    register("CgroupReconcile", CgroupReconcileStrategy)
    register("CPUBurst", CPUBurstStrategy)
    register("CPUEvict", CPUEvictStrategy)
    register("CPUSuppress", CPUSuppressStrategy)
    register("MemoryEvict", MemoryEvictStrategy)
    register("PSIInterference", PSIInterferenceStrategy)
    register("ResctrlReconcile", ResctrlReconcileStrategy)
    register("SystemConfigReconcile", SystemConfigStrategy)


_register_builtin()
