"""Every NodeSLO config error message of the eviction features (koordlet's texts)."""

from __future__ import annotations

from typing import Any

import pytest

from koordqos.strategies.thresholds import (
    check_be_satisfaction,
    check_cpu_allocatable,
    check_cpu_used,
    check_memory_allocatable,
    check_memory_common,
    check_memory_used,
)

from .conftest import make_slo


def t(**kw: Any) -> Any:
    """A merged threshold strategy; memory threshold defaults to 70 after the merge."""
    return make_slo(**kw).resource_used_threshold_with_be


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({}, "CPUEvictBESatisfactionLowerPercent or CPUEvictBESatisfactionUpperPercent not config"),
        (
            {"cpuEvictBESatisfactionLowerPercent": 0, "cpuEvictBESatisfactionUpperPercent": 50},
            "CPUEvictBESatisfactionLowerPercent(0) is not valid! must (0,60]",
        ),
        (
            {"cpuEvictBESatisfactionLowerPercent": 61, "cpuEvictBESatisfactionUpperPercent": 70},
            "CPUEvictBESatisfactionLowerPercent(61) is not valid! must (0,60]",
        ),
        (
            {"cpuEvictBESatisfactionLowerPercent": 30, "cpuEvictBESatisfactionUpperPercent": 100},
            "CPUEvictBESatisfactionUpperPercent(100) is not valid,must (0,100)",
        ),
        (
            {"cpuEvictBESatisfactionLowerPercent": 40, "cpuEvictBESatisfactionUpperPercent": 30},
            "CPUEvictBESatisfactionUpperPercent(30) < CPUEvictBESatisfactionLowerPercent(40)",
        ),
        ({"cpuEvictBESatisfactionLowerPercent": 30, "cpuEvictBESatisfactionUpperPercent": 40}, None),
    ],
)
def test_be_satisfaction(kw: dict[str, int], msg: str | None) -> None:
    assert check_be_satisfaction(t(**kw)) == msg


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({}, "CPUEvictThresholdPercent not config"),
        ({"cpuEvictThresholdPercent": -1}, "threshold percent(-1) should greater than 0"),
        (
            {"cpuEvictThresholdPercent": 20, "cpuEvictLowerPercent": 30},
            "lower percent(30) should less than threshold percent(20)",
        ),
        (
            {"cpuEvictThresholdPercent": 20, "cpuEvictLowerPercent": 10},
            "EvictEnabledPriorityThreshold not config",
        ),
        ({"cpuEvictThresholdPercent": 20, "evictEnabledPriorityThreshold": 0}, None),
        (
            {"cpuEvictThresholdPercent": 20, "cpuEvictLowerPercent": 10, "evictEnabledPriorityThreshold": 0},
            None,
        ),
    ],
)
def test_cpu_used(kw: dict[str, int], msg: str | None) -> None:
    assert check_cpu_used(t(**kw)) == msg


@pytest.mark.parametrize("check", [check_cpu_allocatable, check_memory_allocatable])
@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({}, "{K}AllocatableEvictThresholdPercent not config"),
        ({"T": -1}, "threshold percent(-1) should greater than 0"),
        ({"T": 80}, "{K}AllocatableEvictLowerPercent not config"),
        ({"T": 80, "L": 90}, "lower percent(90) should less than threshold percent(80)"),
        ({"T": 80, "L": 80}, "lower percent(80) should less than threshold percent(80)"),
        ({"T": 80, "L": 70}, "AllocatableEvictPriorityThreshold not config"),
        (
            {"T": 90, "L": 0, "P": 9999},
            "priorityThresholdPercent(9999) should less than 7999, koor-prod pods should not be killed",
        ),
        ({"T": 80, "L": 70, "P": 7500}, None),
        ({"T": 85, "L": 75, "P": 7999}, None),
    ],
)
def test_allocatable(check: Any, kw: dict[str, int], msg: str | None) -> None:
    kind = "CPU" if check is check_cpu_allocatable else "Memory"
    prefix = "cpu" if kind == "CPU" else "memory"
    names = {
        "T": f"{prefix}AllocatableEvictThresholdPercent",
        "L": f"{prefix}AllocatableEvictLowerPercent",
        "P": "allocatableEvictPriorityThreshold",
    }
    got = check(t(**{names[k]: v for k, v in kw.items()}))
    assert got == (msg.replace("{K}", kind) if msg else None)


def test_memory_messages() -> None:
    assert check_memory_common(None) == "resourceThresholdStrategy not config"
    assert check_be_satisfaction(None) == "ResourceThresholdStrategy not config"
    assert check_cpu_used(None) == "ResourceThresholdStrategy not config"
    assert check_cpu_allocatable(None) == "ResourceThresholdStrategy not config"
    assert check_memory_allocatable(None) == "ResourceThresholdStrategy not config"
    unmerged = make_slo().resource_used_threshold_with_be.model_copy(
        update={"memory_evict_threshold_percent": None}
    )
    assert check_memory_common(unmerged) == "threshold percent is nil"
    assert check_memory_common(t(memoryEvictThresholdPercent=-1)) == (
        "threshold percent(-1) should equal or greater than 0"
    )
    assert check_memory_common(t(memoryEvictThresholdPercent=80, memoryEvictLowerPercent=90)) == (
        "lower percent(90) should less than threshold percent(80)"
    )
    assert check_memory_used(t(memoryEvictThresholdPercent=80, memoryEvictLowerPercent=70)) == (
        "EvictEnabledPriorityThreshold not config"
    )
    assert check_memory_common(t()) is None  # merged default threshold 70, lower 68
