"""CgroupReconcile (memory QoS) planner: every koordlet case (docs/reconcile.md, "Memory QoS")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.model.keys import BATCH_MEMORY
from koordqos.model.memoryqos import default_memory_qos
from koordqos.model.nodeslo import NodeSLO, parse_nodeslo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.strategies.memoryqos import (
    MEMORY_QOS_RESOURCES,
    NONE_TEMPLATE,
    merged_memory_qos,
    plan_memory_qos,
)

Gi = 1 << 30
MAX = -1  # the planner's "unlimited" (rendered 9223372036854775807 on v1, "max" on v2)
ALL = frozenset(MEMORY_QOS_RESOURCES)
V1_FILES = ALL - {
    "memory.pagecache_limit.enable",
    "memory.pagecache_limit.size",
    "memory.pagecache_limit.sync",
}
POD = "kubepods/burstable/podtest-pod"
BE_POD = "kubepods/besteffort/podtest-pod"


@pytest.fixture
def layout(tmp_path: Path) -> CgroupLayout:
    return CgroupLayout(tmp_path, CgroupVersion.V1, CgroupDriver.CGROUPFS)


def make_test_pod(qos: str | None, kube_qos: KubeQoS, annotations: dict[str, str] | None = None) -> PodInfo:
    res = BATCH_MEMORY if qos == "BE" else "memory"
    return PodInfo(
        uid="test-pod",
        name="test_pod",
        namespace="default",
        labels={"koordinator.sh/qosClass": qos} if qos else {},
        annotations=annotations or {},
        kube_qos=kube_qos,
        containers=(
            ContainerInfo(name="test", container_id="containerd://test"),
            ContainerInfo(
                name="main", container_id="containerd://main", requests={res: Gi}, limits={res: Gi}
            ),
        ),
    )


def slo_with(**classes: dict[str, Any]) -> NodeSLO:
    return parse_nodeslo({"spec": {"resourceQOSStrategy": {k: {"memoryQOS": v} for k, v in classes.items()}}})


def writes(plan_writes: list[CgroupWrite]) -> dict[tuple[str, str], int | str]:
    return {(w.parent, w.resource.removeprefix("memory.")): w.value for w in plan_writes}


def of(got: dict[tuple[str, str], int | str], parent: str) -> dict[str, int | str]:
    return {r: v for (p, r), v in got.items() if p == parent}


KNOBS0 = {"priority": 0, "use_priority_oom": 0, "oom.group": 0}


def test_case1_ls_pod_node_defaults(layout: CgroupLayout) -> None:
    cfg = {
        "enable": True,
        "minLimitPercent": 0,
        "lowLimitPercent": 0,
        "throttlingPercent": 0,
        "wmarkRatio": 95,
        "wmarkScalePermill": 20,
        "wmarkMinAdj": 0,
    }
    slo = slo_with(lsClass=cfg)
    plan = plan_memory_qos({"u": make_test_pod("LS", KubeQoS.BURSTABLE)}, slo, layout, Gi, V1_FILES)
    got = writes(plan.writes)
    assert of(got, "kubepods") == {"min": 0, "low": 0, **KNOBS0}
    assert of(got, "kubepods/burstable") == {"min": 0, "low": 0, **KNOBS0}
    assert of(got, "kubepods/besteffort") == KNOBS0
    static = {"wmark_ratio": 95, "wmark_scale_factor": 20, "wmark_min_adj": 0, **KNOBS0}
    assert of(got, POD) == {"min": 0, "low": 0, **static}
    for c in ("test", "main"):
        assert of(got, f"{POD}/{c}") == {"min": 0, "low": 0, "high": MAX, **static}
    assert plan.problems == {}
    levels = [w.level for w in plan.writes]
    assert levels == sorted(levels)  # QoS first; the executor orders the rest anyway


def _be_auto(layout: CgroupLayout, pod_cfg: dict[str, Any]) -> dict[tuple[str, str], int | str]:
    ann = {"koordinator.sh/memoryQOS": json.dumps({"policy": "auto", **pod_cfg})}
    slo = parse_nodeslo({"spec": {"resourceQOSStrategy": {"lsrClass": {}, "lsClass": {}, "beClass": {}}}})
    # "empty node classes": no memoryQOS at class level
    slo = slo.model_copy(
        update={
            "resource_qos_strategy": slo.resource_qos_strategy.model_copy(  # type: ignore[union-attr]
                update={
                    "lsr_class": None,
                    "ls_class": None,
                    "be_class": None,
                    "system_class": None,
                }
            )
        }
    )
    plan = plan_memory_qos({"u": make_test_pod("BE", KubeQoS.BESTEFFORT, ann)}, slo, layout, Gi, V1_FILES)
    assert plan.problems == {}
    return writes(plan.writes)


def test_case2_be_pod_auto_min100_throttling80(layout: CgroupLayout) -> None:
    got = _be_auto(
        layout,
        {
            "minLimitPercent": 100,
            "lowLimitPercent": 0,
            "throttlingPercent": 80,
            "wmarkRatio": 95,
            "wmarkScalePermill": 20,
            "wmarkMinAdj": 50,
        },
    )
    assert of(got, "kubepods") == {"min": 1073741824, "low": 0}
    assert of(got, "kubepods/besteffort") == {"min": 1073741824, "low": 0}
    assert of(got, "kubepods/burstable") == {}
    static = {"wmark_ratio": 95, "wmark_scale_factor": 20, "wmark_min_adj": 50, **KNOBS0}
    assert of(got, BE_POD) == {"min": 1073741824, "low": 0, **static}
    assert of(got, f"{BE_POD}/test") == {"min": 0, "low": 0, "high": 858992640, **static}
    assert of(got, f"{BE_POD}/main") == {"min": 1073741824, "low": 0, "high": 1073741824, **static}


def test_case3_be_pod_auto_min50_throttling40(layout: CgroupLayout) -> None:
    got = _be_auto(layout, {"minLimitPercent": 50, "throttlingPercent": 40})
    assert of(got, "kubepods")["min"] == 536870912
    assert of(got, "kubepods/besteffort")["min"] == 536870912
    assert of(got, BE_POD)["min"] == 536870912
    assert of(got, f"{BE_POD}/test")["high"] == 429494272
    assert of(got, f"{BE_POD}/main")["min"] == 536870912
    assert of(got, f"{BE_POD}/main")["high"] == 1073741824


def test_case4_system_pod_defaults(layout: CgroupLayout) -> None:
    plan = plan_memory_qos(
        {"u": make_test_pod("SYSTEM", KubeQoS.BURSTABLE)}, parse_nodeslo({}), layout, Gi, V1_FILES
    )
    got = writes(plan.writes)
    assert {k: of(got, POD)[k] for k in ("wmark_ratio", "wmark_scale_factor", "wmark_min_adj")} == {
        "wmark_ratio": 0,
        "wmark_scale_factor": 50,
        "wmark_min_adj": 0,
    }
    assert of(got, f"{POD}/main")["high"] == MAX


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        ({"pageCacheLimitSize": "512Mi"}, {"enable": 1, "size": 536870912, "sync": 0}),
        ({"pageCacheLimitSize": "2Gi"}, {"enable": 1, "size": 1073741824, "sync": 0}),
        ({"pageCacheLimitSize": 0}, {"enable": 0, "size": 0}),
        ({}, {}),
        (
            {"pageCacheLimitSize": "512Mi", "pageCacheEnable": False},
            {"enable": 0, "size": 536870912, "sync": 0},
        ),
        ({"pageCacheEnable": True}, {"enable": 1}),
        ({"pageCacheLimitPercent": 50}, {"enable": 1, "size": 536870912, "sync": 0}),
        (
            {"pageCacheLimitSize": "256Mi", "pageCacheLimitPercent": 50},
            {"enable": 1, "size": 268435456, "sync": 0},
        ),
        (
            {"pageCacheLimitSize": "512Mi", "pageCacheReclaimSync": True},
            {"enable": 1, "size": 536870912, "sync": 1},
        ),
    ],
)
def test_case5_page_cache_v2(tmp_path: Path, cfg: dict[str, Any], expected: dict[str, int]) -> None:
    layout = CgroupLayout(tmp_path, CgroupVersion.V2, CgroupDriver.CGROUPFS)
    pod = PodInfo(
        uid="test-pod",
        labels={"koordinator.sh/qosClass": "LS"},
        kube_qos=KubeQoS.GUARANTEED,
        containers=(ContainerInfo(name="main", requests={"memory": Gi}, limits={"memory": Gi}),),
    )
    slo = slo_with(lsClass={"enable": True, **cfg})
    plan = plan_memory_qos({"u": pod}, slo, layout, 4 * Gi, ALL)
    got = {
        r.removeprefix("pagecache_limit."): v
        for (p, r), v in writes(plan.writes).items()
        if p == "kubepods/podtest-pod" and r.startswith("pagecache")
    }
    assert got == expected
    # cgroup v1: the page-cache files are not registered, so never planned
    plan_v1 = plan_memory_qos({"u": pod}, slo, CgroupLayout(tmp_path), 4 * Gi, V1_FILES)
    assert not any("pagecache" in w.resource for w in plan_v1.writes)


def test_case6_merge_policies() -> None:
    none_pod = make_test_pod("LS", KubeQoS.BURSTABLE, {"koordinator.sh/memoryQOS": '{"policy":"none"}'})
    assert (
        merged_memory_qos(none_pod, slo_with(lsClass={"enable": True, "minLimitPercent": 80}))
        == NONE_TEMPLATE
    )
    assert NONE_TEMPLATE.enable is False
    assert NONE_TEMPLATE.wmark_scale_permill == 50

    auto = {"koordinator.sh/memoryQOS": '{"policy":"auto"}'}
    be_defaults = default_memory_qos("BE")
    assert be_defaults is not None
    assert be_defaults.wmark_min_adj == 50
    got = merged_memory_qos(make_test_pod("BE", KubeQoS.BESTEFFORT, auto), parse_nodeslo({}))
    assert got == be_defaults.model_copy(update={"enable": False})

    auto90 = {"koordinator.sh/memoryQOS": '{"policy":"auto","throttlingPercent":90}'}
    got = merged_memory_qos(make_test_pod("BE", KubeQoS.BESTEFFORT, auto90), parse_nodeslo({}))
    assert got == be_defaults.model_copy(update={"enable": False, "throttling_percent": 90})

    # no QoS label, kube BestEffort → BE defaults
    got = merged_memory_qos(make_test_pod(None, KubeQoS.BESTEFFORT, auto), parse_nodeslo({}))
    assert got is not None
    assert got.wmark_min_adj == 50
    assert got.wmark_ratio == 95

    # unparsable annotation: ignored, the class config applies
    bad = make_test_pod("LS", KubeQoS.BURSTABLE, {"koordinator.sh/memoryQOS": "{not json"})
    cls = slo_with(lsClass={"enable": True, "minLimitPercent": 80})
    assert merged_memory_qos(bad, cls) == cls.resource_qos_strategy.ls_class.memory_qos  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("field", "value", "resource"),
    [
        ("wmarkRatio", 101, "wmark_ratio"),
        ("wmarkRatio", -1, "wmark_ratio"),
        ("wmarkMinAdj", -51, "wmark_min_adj"),
        ("wmarkMinAdj", 53, "wmark_min_adj"),
    ],
)
def test_case7_invalid_values_are_not_written(
    layout: CgroupLayout, field: str, value: int, resource: str
) -> None:
    slo = slo_with(lsClass={"enable": True, "wmarkRatio": 95, "wmarkMinAdj": 0, field: value})
    plan = plan_memory_qos({"u": make_test_pod("LS", KubeQoS.BURSTABLE)}, slo, layout, Gi, V1_FILES)
    got = writes(plan.writes)
    assert resource not in of(got, POD)
    assert resource not in of(got, f"{POD}/main")
    assert "priority" in of(got, POD)  # the valid knobs still are
    (problems,) = plan.problems.values()
    assert any(field in msg and str(value) in msg for msg in problems.values())


def test_case7_non_running_pods_are_ignored(layout: CgroupLayout) -> None:
    pod = make_test_pod("LS", KubeQoS.BURSTABLE).model_copy(update={"phase": "Succeeded"})
    plan = plan_memory_qos(
        {"u": pod}, slo_with(lsClass={"enable": True, "minLimitPercent": 50}), layout, Gi, V1_FILES
    )
    assert all(w.level is Level.QOS for w in plan.writes)
    assert "min" not in of(writes(plan.writes), "kubepods/burstable")


def test_unsupported_files_are_never_planned(layout: CgroupLayout) -> None:
    plan = plan_memory_qos(
        {"u": make_test_pod("LS", KubeQoS.BURSTABLE)},
        parse_nodeslo({}),
        layout,
        Gi,
        frozenset({"memory.min"}),
    )
    assert plan.writes
    assert {w.resource for w in plan.writes} == {"memory.min"}
    assert (
        plan_memory_qos(
            {"u": make_test_pod("LS", KubeQoS.BURSTABLE)}, parse_nodeslo({}), layout, Gi, frozenset()
        ).writes
        == []
    )


def test_low_and_high_raised_to_min(layout: CgroupLayout) -> None:
    slo = slo_with(
        lsClass={"enable": True, "minLimitPercent": 80, "lowLimitPercent": 40, "throttlingPercent": 10}
    )
    pod = make_test_pod("LS", KubeQoS.BURSTABLE)
    got = writes(plan_memory_qos({"u": pod}, slo, layout, 4 * Gi, V1_FILES).writes)
    main = of(got, f"{POD}/main")
    assert main["min"] == 858993459
    assert main["low"] == 858993459
    assert main["high"] == 1073741824
    assert of(got, f"{POD}/test")["high"] == 429494272  # no request, no limit: 10 % of allocatable
    # the pod level: low raised to min; the QoS sums keep the raw values
    assert of(got, POD)["low"] == of(got, POD)["min"] == 858993459
    assert of(got, "kubepods/burstable") == {"min": 858993459, "low": 429496729, **KNOBS0}
