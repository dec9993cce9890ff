"""Memory QoS per class: the recommended settings of a class (pod policy `auto`) and the accepted range of
each knob the memory QoS strategy writes (a value outside is not written; docs/reconcile.md)."""

from __future__ import annotations

from collections.abc import Mapping

from koordqos.model.nodeslo import DEFAULT_SPEC, MemoryQOS

_CLASS_KEYS = {
    "LSE": "lsrClass",
    "LSR": "lsrClass",
    "LS": "lsClass",
    "BE": "beClass",
    "SYSTEM": "systemClass",
}


def default_memory_qos(qos: str) -> MemoryQOS | None:
    """Recommended memory QoS of a class (pod policy `auto`): LSE/LSR/LS, BE, SYSTEM; None otherwise."""
    key = _CLASS_KEYS.get(qos)
    if key is None:
        return None
    return MemoryQOS.model_validate(DEFAULT_SPEC["resourceQOSStrategy"][key]["memoryQOS"])


# -- validators of the knobs the reconcile strategies write (docs/reconcile.md, "Memory QoS") ----------------

#: MemoryQOS field → (wire name, lowest, highest) accepted; a value outside is not written (file unchanged).
MEMORY_QOS_RANGES: Mapping[str, tuple[str, int, int | None]] = {
    "min_limit_percent": ("minLimitPercent", 0, None),
    "low_limit_percent": ("lowLimitPercent", 0, None),
    "throttling_percent": ("throttlingPercent", 0, None),
    "wmark_ratio": ("wmarkRatio", 0, 100),
    "wmark_scale_permill": ("wmarkScalePermill", 1, 1000),
    "wmark_min_adj": ("wmarkMinAdj", -25, 50),
    "priority_enable": ("priorityEnable", 0, 1),
    "priority": ("priority", 0, 12),
    "oom_kill_group": ("oomKillGroup", 0, 1),
    "page_cache_limit_percent": ("pageCacheLimitPercent", 0, 100),
}


def memory_qos_problems(cfg: MemoryQOS) -> dict[str, str]:
    """Out-of-range fields of a MemoryQOS: python field name → message naming the wire field."""
    out: dict[str, str] = {}
    for name, (wire, lo, hi) in MEMORY_QOS_RANGES.items():
        value = getattr(cfg, name)
        if value is None:
            continue
        if value < lo or (hi is not None and value > hi):
            out[name] = f"{wire} {value} outside [{lo}, {'' if hi is None else hi}]"
    return out


def without_invalid_memory_qos(cfg: MemoryQOS) -> tuple[MemoryQOS, dict[str, str]]:
    """The config with its out-of-range fields unset (so their files stay unchanged), and the problems."""
    problems = memory_qos_problems(cfg)
    if not problems:
        return cfg, problems
    return cfg.model_copy(update=dict.fromkeys(problems)), problems
