"""ResctrlReconcile planner and resctrl math: every koordlet case (docs/reconcile.md, "Resctrl";
docs/behaviour-runtime-hooks.md, "Resctrl hook")."""

from __future__ import annotations

import json

import pytest

from koordqos.errors import ModelError
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.model.resctrl import (
    VENDOR_AMD,
    VENDOR_INTEL,
    cat_l3_mask,
    l3_line,
    mb_line,
    mba_value,
    parse_cbm,
    parse_pod_resctrl,
    parse_schemata,
    same_schemata,
)
from koordqos.strategies.resctrl import (
    ResctrlInfo,
    ResctrlInputs,
    class_schemata,
    plan_resctrl,
    threads_needed,
)


@pytest.mark.parametrize(
    ("cbm", "start", "end", "mask"),
    [
        (0xFF, 0, 100, "ff"),
        (0x3FF, 10, 80, "fe"),
        (0x7FF, 10, 50, "3c"),
        (0x3FF, 0, 30, "7"),
        (0x3FF, 10, 85, "1fe"),
        (0x7FF, 0, 50, "3f"),
        (0xF, 0, 100, "f"),
    ],
)
def test_cat_l3_mask_spec_cases(cbm: int, start: int, end: int, mask: str) -> None:
    assert cat_l3_mask(cbm, start, end) == mask


@pytest.mark.parametrize(
    ("cbm", "start", "end"),
    [(0x101, 0, 100), (4, 0, 100), (0xFF, -10, 50), (0xFF, 50, 50), (0xFF, 0, 101), (0, 0, 100)],
)
def test_cat_l3_mask_errors(cbm: int, start: int, end: int) -> None:
    with pytest.raises(ValueError, match="cbm|range"):
        cat_l3_mask(cbm, start, end)


def test_parse_cbm() -> None:
    assert parse_cbm("7ff\n") == 0x7FF
    assert parse_cbm("0x3ff") == 0x3FF
    for bad in ("", "zz"):
        with pytest.raises(ValueError, match="cbm|invalid literal"):
            parse_cbm(bad)


def test_schemata_lines_spec() -> None:
    assert l3_line([1, 0], cat_l3_mask(0x7FF, 10, 50)) == "L3:0=3c;1=3c;\n"
    assert l3_line([0, 1], cat_l3_mask(0x7FF, 0, 50)) == "L3:0=3f;1=3f;\n"
    assert mb_line([0, 1], mba_value(90, VENDOR_INTEL) or "") == "MB:0=90;1=90;\n"
    assert mb_line([0, 1, 2, 3], mba_value(30, VENDOR_AMD) or "") == "MB:0=48;1=48;2=48;3=48;\n"
    assert mb_line([0], mba_value(100, VENDOR_AMD) or "") == "MB:0=2048;\n"


@pytest.mark.parametrize(
    ("percent", "vendor", "value"),
    [
        (85, VENDOR_INTEL, "90"),
        (80, VENDOR_INTEL, "80"),
        (90, VENDOR_INTEL, "90"),
        (100, VENDOR_INTEL, "100"),
        (80, VENDOR_AMD, "128"),
        (30, VENDOR_AMD, "48"),
        (100, VENDOR_AMD, "2048"),
        (0, VENDOR_INTEL, None),
        (101, VENDOR_INTEL, None),
        (None, VENDOR_INTEL, None),
        (0, VENDOR_AMD, None),
    ],
)
def test_mba_values(percent: int | None, vendor: str, value: str | None) -> None:
    assert mba_value(percent, vendor) == value


def test_parse_and_compare_schemata() -> None:
    text = "    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n"
    assert parse_schemata(text) == {"L3": {0: "7ff", 1: "7ff"}, "MB": {0: "100", 1: "100"}}
    assert same_schemata("L3:0=03c;1=03c\nMB:0=90;1=90\n", "L3:0=3c;1=3c;\n")
    assert not same_schemata("L3:0=03c;1=03f\n", "L3:0=3c;1=3c;\n")
    assert not same_schemata("MB:0=90\n", "L3:0=3c;\n")


INFO2 = ResctrlInfo(cbm=0x7FF, cache_ids=(0, 1), vendor=VENDOR_INTEL)


def _slo(**classes: dict[str, object]) -> object:
    return parse_nodeslo(
        {"spec": {"resourceQOSStrategy": {k: {"resctrlQOS": v} for k, v in classes.items()}}}
    )


def test_class_schemata_spec_cases() -> None:
    slo = parse_nodeslo(
        {
            "spec": {
                "resourceQOSStrategy": {
                    "lsClass": {
                        "resctrlQOS": {"enable": True, "catRangeStartPercent": 10, "catRangeEndPercent": 50}
                    },
                    "lsrClass": {
                        "resctrlQOS": {"enable": True, "catRangeStartPercent": 0, "catRangeEndPercent": 50}
                    },
                    "beClass": {"resctrlQOS": {"enable": True, "mbaPercent": 90}},
                }
            }
        }
    )
    plan = plan_resctrl(ResctrlInputs(slo, INFO2, {}, {}, {}))
    assert plan.schemata["LS"] == "L3:0=3c;1=3c;\nMB:0=100;1=100;\n"
    assert plan.schemata["LSR"] == "L3:0=3f;1=3f;\nMB:0=100;1=100;\n"
    # BE default range 0-30 of 11 ways: ceil(3.3)=4 ways → f
    assert plan.schemata["BE"] == "L3:0=f;1=f;\nMB:0=90;1=90;\n"
    assert plan.problems == {}


def test_disabled_classes_get_the_none_template() -> None:
    plan = plan_resctrl(ResctrlInputs(parse_nodeslo({}), INFO2, {}, {}, {}))
    full = "L3:0=7ff;1=7ff;\nMB:0=100;1=100;\n"
    assert plan.schemata == {"LSR": full, "LS": full, "BE": full}
    assert plan.tasks == {}


def test_amd_be_30_percent_on_four_caches() -> None:
    from koordqos.model.nodeslo import ResctrlQOS

    info = ResctrlInfo(0x7FF, (0, 1, 2, 3), VENDOR_AMD)
    text, problem = class_schemata(ResctrlQOS(enable=True, mba_percent=30), info)
    assert text == "MB:0=48;1=48;2=48;3=48;\n"
    assert problem is None
    text, problem = class_schemata(ResctrlQOS(enable=True, mba_percent=101), info)
    assert text == ""
    assert problem is not None
    assert "101" in problem
    text, problem = class_schemata(
        ResctrlQOS(enable=True, cat_range_start_percent=50, cat_range_end_percent=50), info
    )
    assert text == ""
    assert problem is not None


def _pod(
    uid: str, qos: str | None, annotations: dict[str, str] | None = None, phase: str = "Running"
) -> PodInfo:
    labels = {"koordinator.sh/qosClass": qos} if qos else {}
    return PodInfo(
        uid=uid,
        name=uid,
        namespace="ns",
        labels=labels,
        annotations=annotations or {},
        phase=phase,
        kube_qos=KubeQoS.BESTEFFORT,
        containers=(ContainerInfo(name="c", container_id=f"containerd://{uid}c"),),
    )


ENABLED = parse_nodeslo(
    {
        "spec": {
            "resourceQOSStrategy": {
                c: {"resctrlQOS": {"enable": True}} for c in ("lsrClass", "lsClass", "beClass")
            }
        }
    }
)


def test_tasks_spec_cases() -> None:
    pods = {"be": _pod("be", "BE"), "lse": _pod("lse", "LSE"), "sys": _pod("sys", "SYSTEM")}
    threads = {
        "be": [122450, 122454, 123111, 128912],
        "lse": [4321, 4322, 4323, 4400],
        "sys": [1, 2],
    }
    plan = plan_resctrl(ResctrlInputs(ENABLED, INFO2, pods, {"BE": frozenset({122450})}, threads))
    assert plan.tasks == {"BE": [122454, 123111, 128912], "LSR": [4321, 4322, 4323, 4400]}
    ids = plan_resctrl(ResctrlInputs(ENABLED, INFO2, {"be": pods["be"]}, {}, {"be": [9, 0, 7, 1, 5, 2]}))
    assert ids.tasks == {"BE": [0, 1, 2, 5, 7, 9]}


def test_tasks_skip_inactive_disabled_and_annotated_pods() -> None:
    be_only = parse_nodeslo({"spec": {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True}}}}})
    pods = {
        "done": _pod("done", "BE", phase="Succeeded"),
        "ls": _pod("ls", "LS"),
        "ann": _pod("ann", "BE", {"node.koordinator.sh/resctrl": "{}"}),
    }
    threads = {"done": [1], "ls": [2], "ann": [3]}
    plan = plan_resctrl(ResctrlInputs(be_only, INFO2, pods, {}, threads))
    assert plan.tasks == {}
    assert threads_needed(pods, be_only, pod_groups=False) == []
    assert threads_needed(pods, be_only, pod_groups=True) == ["ann"]


def test_pod_groups_created_filled_and_collected() -> None:
    ann = json.dumps({"llc": {"schemata": {"range": [0, 50]}}, "mb": {"schemata": {"percent": 85}}})
    pods = {"p1": _pod("p1", "LS", {"node.koordinator.sh/resctrl": ann}), "p2": _pod("p2", "BE")}
    plan = plan_resctrl(
        ResctrlInputs(
            ENABLED,
            INFO2,
            pods,
            {"koordlet-p1": frozenset({10})},
            {"p1": [10, 11], "p2": [20]},
            pod_groups=True,
            existing_pod_groups=frozenset({"koordlet-gone"}),
        )
    )
    assert plan.create == ["koordlet-p1"]
    assert plan.schemata["koordlet-p1"] == "L3:0=3f;1=3f;\nMB:0=90;1=90;\n"
    assert plan.tasks == {"koordlet-p1": [11], "BE": [20]}
    assert plan.remove == ["koordlet-gone"]
    # without the hook gate: no pod groups, and the annotated pod still stays out of the class groups
    off = plan_resctrl(ResctrlInputs(ENABLED, INFO2, pods, {}, {"p1": [10], "p2": [20]}))
    assert off.create == []
    assert off.remove == []
    assert off.tasks == {"BE": [20]}


def test_pod_annotation_per_cache_and_errors() -> None:
    raw = json.dumps(
        {
            "llc": {"schemataPerCache": [{"cacheID": 1, "range": [10, 50]}]},
            "mb": {"schemataPerCache": [{"cacheID": 0, "percent": 30}]},
        }
    )
    parsed = parse_pod_resctrl(raw)
    assert parsed.schemata(0x7FF, [0, 1], VENDOR_INTEL) == "L3:1=3c;\nMB:0=30;\n"
    for bad in ("{", "[]", '{"llc": {"schemata": {"range": [1]}}}', '{"mb": {"schemata": {"percent": "x"}}}'):
        with pytest.raises(ModelError):
            parse_pod_resctrl(bad)
    pods = {"p": _pod("p", "LS", {"node.koordinator.sh/resctrl": "{"})}
    plan = plan_resctrl(ResctrlInputs(ENABLED, INFO2, pods, {}, {"p": [1]}, pod_groups=True))
    assert "ns/p" in plan.problems
    assert plan.create == []
    assert plan.tasks == {}
