"""Feature gates: koordlet's names and defaults, parsed from `--feature-gates=A=true,B=false`."""

from __future__ import annotations

from collections.abc import Mapping

from koordqos.errors import ConfigError

# koordlet's gates (qos-manager.md §1.6, runtime-hooks.md §7) with their defaults.
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
}

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
            known = ", ".join(sorted(DEFAULT_GATES))
            raise ConfigError(f"unknown feature gate {name!r} (known: {known}, AllAlpha, AllBeta)")
        gates[name] = val
    return gates


def _to_bool(name: str, raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f"feature gate {name}: invalid value {raw!r} (expected true or false)")
