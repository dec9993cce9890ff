"""Feature gates: koordlet's names and defaults, parsed from `--feature-gates=A=true,B=false`.

Every koordlet gate name is accepted, so a koordlet DaemonSet's `-feature-gates` starts koordqos; those it
does not implement or does not act on yet are listed (`NOT_IMPLEMENTED`, `NOT_ACTED_ON`) and warned about
once at start when on. An unknown name is an error with the closest known one.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from koordqos.errors import ConfigError

# koordlet's gates with their defaults (docs/behaviour-qos-manager.md, "Feature gates and the NodeSLO
# switch").
DEFAULT_GATES: Mapping[str, bool] = {
    # QoS manager
    "BECPUSuppress": True,
    "BECPUManager": False,
    "BECPUEvict": False,
    "CPUEvict": False,
    "CPUAllocatableEvict": False,
    "BEMemoryEvict": False,
    "MemoryEvict": False,
    "MemoryAllocatableEvict": False,
    "CPUBurst": True,
    "SystemConfig": False,
    "RdtResctrl": True,
    "CgroupReconcile": False,
    "BlkIOReconcile": False,
    # runtime hooks
    "GroupIdentity": True,
    "CPUSetAllocator": True,
    "BatchResource": True,
    "GPUEnvInject": False,
    "RDMADeviceInject": False,
    "CPUNormalization": False,
    "CoreSched": False,
    "TerwayQoS": False,
    "TCNetworkQoS": False,
    "Resctrl": False,
    "OOMScoreAdj": False,
    # others that affect behaviour
    "PerCPUMetric": False,
    "PSICollector": False,
    "PSIInterference": False,  # koordqos's own: the PSI interference rules (docs/psi.md)
    "NodeTopologyReport": True,
    "HugePageReport": False,
    "Accelerators": False,
    # koordlet's that koordqos does not implement (accepted so a koordlet DaemonSet's arguments start it)
    "AuditEvents": False,
    "AuditEventsHTTPHandler": False,
    "CPICollector": False,
    "Libpfm4": False,
    "ColdPageCollector": False,
    "ResctrlCollector": False,
    "RDMADevices": False,
    "PodResourcesProxy": False,
    "HamiCoreVGPUMonitor": False,
    "NodeMetricPromMetrics": False,
}

# On, these change nothing in koordqos: the agent warns once at start, listing those that are on.
#: koordlet features koordqos does not implement
NOT_IMPLEMENTED: tuple[str, ...] = (
    "AuditEvents",
    "AuditEventsHTTPHandler",
    "CPICollector",
    "Libpfm4",
    "ColdPageCollector",
    "ResctrlCollector",
    "RDMADevices",
    "PodResourcesProxy",
    "HamiCoreVGPUMonitor",
    "NodeMetricPromMetrics",
)
#: gates koordqos accepts but does not act on yet
NOT_ACTED_ON: tuple[str, ...] = (
    "TerwayQoS",
    "TCNetworkQoS",
    "GPUEnvInject",
    "RDMADeviceInject",
    "Accelerators",
    "PerCPUMetric",
)

_ALPHA = {
    "BECPUManager",
    "BECPUEvict",
    "CPUEvict",
    "CPUAllocatableEvict",
    "BEMemoryEvict",
    "MemoryEvict",
    "MemoryAllocatableEvict",
    "SystemConfig",
    "CgroupReconcile",
    "BlkIOReconcile",
    "GPUEnvInject",
    "RDMADeviceInject",
    "CPUNormalization",
    "CoreSched",
    "TerwayQoS",
    "TCNetworkQoS",
    "Resctrl",
    "OOMScoreAdj",
    "PerCPUMetric",
    "PSICollector",
    "PSIInterference",
    "Accelerators",
    "HugePageReport",
    *NOT_IMPLEMENTED,
}
_BETA = {n for n in DEFAULT_GATES if n not in _ALPHA}

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_feature_gates(text: str | Mapping[str, bool] | None) -> dict[str, bool]:
    """Parse `A=true,B=false` (or a mapping) into the full gate map, defaults filled in."""
    gates = dict(DEFAULT_GATES)
    if text is None or text == "":
        return gates
    items: list[tuple[str, str | bool]]
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ConfigError(f"feature gate {part!r}: expected Name=true|false")
            name, _, value = part.partition("=")
            items.append((name.strip(), value.strip()))
    for name, raw in items:
        val = _to_bool(name, raw)
        if name in ("AllAlpha", "AllBeta"):
            for gate in _ALPHA if name == "AllAlpha" else _BETA:
                gates[gate] = val
            continue
        if name not in DEFAULT_GATES:
            raise ConfigError(unknown_gate(name))
        gates[name] = val
    return gates


def unknown_gate(name: str) -> str:
    """The error for an unknown gate: the closest known name ("did you mean"), else the known names."""
    known = [*DEFAULT_GATES, "AllAlpha", "AllBeta"]
    folded = {k.lower(): k for k in known}
    close = [folded[name.lower()]] if name.lower() in folded else difflib.get_close_matches(name, known, n=1)
    if close:
        return f"unknown feature gate {name!r} (did you mean {close[0]!r}?)"
    return f"unknown feature gate {name!r} (known: {', '.join(sorted(known))})"


def inert_gates(gates: Mapping[str, bool]) -> tuple[list[str], list[str]]:
    """The gates on that change nothing: (not implemented, not acted on yet), each in its list's order."""
    return [g for g in NOT_IMPLEMENTED if gates.get(g)], [g for g in NOT_ACTED_ON if gates.get(g)]


def _to_bool(name: str, raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f"feature gate {name}: invalid value {raw!r} (expected true or false)")
