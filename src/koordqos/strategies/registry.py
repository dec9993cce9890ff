"""Strategy registry: name → factory, in a fixed set-up/start order (docs/behaviour-qos-manager.md,
"Strategies and their order")."""

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


# koordlet's table order (BlkioReconcile, CgroupReconcile, CPUBurst, CPUEvict, CPUSuppress, MemoryEvict, …),
# each strategy named by its koordlet gate (#32 6: `BECPUSuppress` in logs, decisions and metrics, not
# `CPUSuppress`); the two eviction strategies serve three gates each and keep the gate of the same name, their
# tasks and log lines name the gate (`feature`) that made them
ORDER = (
    "BlkIOReconcile",
    "CgroupReconcile",
    "CPUBurst",
    "CPUEvict",
    "BECPUSuppress",
    "MemoryEvict",
    "RdtResctrl",
    "SystemConfig",
    "TCNetworkQoS",  # koordlet's runtime-hook rules (docs/network-qos.md), run as strategies here
    "TerwayQoS",
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
    from koordqos.strategies.tcqos import TCNetworkQoSStrategy
    from koordqos.strategies.terwayqos import TerwayQoSStrategy

    for factory in (
        BlkioReconcileStrategy,
        CgroupReconcileStrategy,
        CPUBurstStrategy,
        CPUEvictStrategy,
        CPUSuppressStrategy,
        MemoryEvictStrategy,
        PSIInterferenceStrategy,
        ResctrlReconcileStrategy,
        SystemConfigStrategy,
        TCNetworkQoSStrategy,
        TerwayQoSStrategy,
    ):
        register(factory.name, factory)


_register_builtin()
