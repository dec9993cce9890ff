"""NodeSLO `resourceUsedThresholdWithBE` checks of the eviction features, with koordlet's error messages."""

from __future__ import annotations

from collections.abc import Callable

from koordqos.model.nodeslo import ResourceThresholdStrategy

PRIORITY_MID_VALUE_MAX = 7999
BE_SATISFACTION_LOWER_MAX = 60
BE_SATISFACTION_UPPER_MAX = 100
RELEASE_BUFFER_PERCENT = 2  # default lower = threshold − 2 (CPU and memory)

Threshold = ResourceThresholdStrategy | None
Validator = Callable[[Threshold], str | None]


def check_be_satisfaction(t: Threshold) -> str | None:
    """BECPUEvict: lower in (0, 60], upper in (0, 100), upper ≥ lower."""
    if t is None:
        return "ResourceThresholdStrategy not config"
    low, up = t.cpu_evict_be_satisfaction_lower_percent, t.cpu_evict_be_satisfaction_upper_percent
    if low is None or up is None:
        return "CPUEvictBESatisfactionLowerPercent or CPUEvictBESatisfactionUpperPercent not config"
    if low > BE_SATISFACTION_LOWER_MAX or low <= 0:
        return f"CPUEvictBESatisfactionLowerPercent({low}) is not valid! must (0,{BE_SATISFACTION_LOWER_MAX}]"
    if up >= BE_SATISFACTION_UPPER_MAX or up <= 0:
        return f"CPUEvictBESatisfactionUpperPercent({up}) is not valid,must (0,{BE_SATISFACTION_UPPER_MAX})"
    if up < low:
        return f"CPUEvictBESatisfactionUpperPercent({up}) < CPUEvictBESatisfactionLowerPercent({low})"
    return None


def cpu_evict_lower(t: ResourceThresholdStrategy) -> int:
    """cpuEvictLowerPercent, default threshold − 2."""
    if t.cpu_evict_lower_percent is not None:
        return t.cpu_evict_lower_percent
    return (t.cpu_evict_threshold_percent or 0) - RELEASE_BUFFER_PERCENT


def memory_evict_lower(t: ResourceThresholdStrategy) -> int:
    """memoryEvictLowerPercent, default threshold − 2."""
    if t.memory_evict_lower_percent is not None:
        return t.memory_evict_lower_percent
    return (t.memory_evict_threshold_percent or 0) - RELEASE_BUFFER_PERCENT


def check_cpu_used(t: Threshold) -> str | None:
    """CPUEvict: threshold set and ≥ 0, lower < threshold, evictEnabledPriorityThreshold set."""
    if t is None:
        return "ResourceThresholdStrategy not config"
    threshold = t.cpu_evict_threshold_percent
    if threshold is None:
        return "CPUEvictThresholdPercent not config"
    if threshold < 0:
        return f"threshold percent({threshold}) should greater than 0"
    lower = cpu_evict_lower(t)
    if lower >= threshold:
        return f"lower percent({lower}) should less than threshold percent({threshold})"
    if t.evict_enabled_priority_threshold is None:
        return "EvictEnabledPriorityThreshold not config"
    return None


def _check_allocatable(t: Threshold, kind: str, threshold: int | None, lower: int | None) -> str | None:
    if t is None:
        return "ResourceThresholdStrategy not config"
    if threshold is None:
        return f"{kind}AllocatableEvictThresholdPercent not config"
    if threshold < 0:
        return f"threshold percent({threshold}) should greater than 0"
    if lower is None:
        return f"{kind}AllocatableEvictLowerPercent not config"
    if lower >= threshold:
        return f"lower percent({lower}) should less than threshold percent({threshold})"
    prio = t.allocatable_evict_priority_threshold
    if prio is None:
        return "AllocatableEvictPriorityThreshold not config"
    if prio > PRIORITY_MID_VALUE_MAX:
        return (
            f"priorityThresholdPercent({prio}) should less than {PRIORITY_MID_VALUE_MAX}, "
            "koor-prod pods should not be killed"
        )
    return None


def check_cpu_allocatable(t: Threshold) -> str | None:
    """CPUAllocatableEvict: threshold ≥ 0, lower < threshold, priority threshold set and ≤ 7999."""
    if t is None:
        return "ResourceThresholdStrategy not config"
    return _check_allocatable(
        t, "CPU", t.cpu_allocatable_evict_threshold_percent, t.cpu_allocatable_evict_lower_percent
    )


def check_memory_allocatable(t: Threshold) -> str | None:
    """MemoryAllocatableEvict: threshold ≥ 0, lower < threshold, priority threshold set and ≤ 7999."""
    if t is None:
        return "ResourceThresholdStrategy not config"
    return _check_allocatable(
        t, "Memory", t.memory_allocatable_evict_threshold_percent, t.memory_allocatable_evict_lower_percent
    )


def check_memory_common(t: Threshold) -> str | None:
    """BEMemoryEvict: threshold set and ≥ 0, lower < threshold."""
    if t is None:
        return "resourceThresholdStrategy not config"
    threshold = t.memory_evict_threshold_percent
    if threshold is None:
        return "threshold percent is nil"
    if threshold < 0:
        return f"threshold percent({threshold}) should equal or greater than 0"
    lower = memory_evict_lower(t)
    if lower >= threshold:
        return f"lower percent({lower}) should less than threshold percent({threshold})"
    return None


def check_memory_used(t: Threshold) -> str | None:
    """MemoryEvict: the common checks plus evictEnabledPriorityThreshold set."""
    err = check_memory_common(t)
    if err is None and t is not None and t.evict_enabled_priority_threshold is None:
        return "EvictEnabledPriorityThreshold not config"
    return err


VALIDATORS: dict[str, Validator] = {
    "BECPUEvict": check_be_satisfaction,
    "CPUEvict": check_cpu_used,
    "CPUAllocatableEvict": check_cpu_allocatable,
    "BEMemoryEvict": check_memory_common,
    "MemoryEvict": check_memory_used,
    "MemoryAllocatableEvict": check_memory_allocatable,
}
