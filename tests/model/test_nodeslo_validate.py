"""The one NodeSLO validator (issue #32 part 5d): CRD constraints, apiVersion/kind, the slo-controller-config
ConfigMap named, messages with path, value and rule; an invalid field keeps its last valid value (or the
default) and the rest of the object applies."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from koordqos.model.nodeslo_validate import (
    SLO_CONTROLLER_CONFIG_HINT,
    NotANodeSLO,
    ValidatedNodeSLO,
    validate_nodeslo,
)

API = "slo.koordinator.sh/v1alpha1"
PYDANTIC_WORDS = ("Input should", "validation error", "type=", "pydantic", "Value error")


def nodeslo(spec: dict[str, Any], rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "NodeSLO",
        "metadata": {"name": "n1", "resourceVersion": rv},
        "spec": spec,
    }


def threshold(spec: dict[str, Any]) -> dict[str, Any]:
    return {"resourceUsedThresholdWithBE": spec}


def suppress(v: ValidatedNodeSLO) -> int | None:
    t = v.slo.resource_used_threshold_with_be
    assert t is not None
    return t.cpu_suppress_threshold_percent


def described(v: ValidatedNodeSLO) -> list[str]:
    return [p.describe() for p in v.problems]


def test_an_out_of_range_threshold_is_not_in_force_and_the_rest_applies() -> None:
    v = validate_nodeslo(
        nodeslo(
            threshold({"enable": True, "cpuSuppressThresholdPercent": 150, "memoryEvictThresholdPercent": 80})
        )
    )
    assert described(v) == [
        "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: out of range: 150 (valid: [0, 100])"
    ]
    t = v.slo.resource_used_threshold_with_be
    assert t is not None
    assert (t.cpu_suppress_threshold_percent, t.enable, t.memory_evict_threshold_percent) == (65, True, 80)
    assert (v.slo.name, v.slo.resource_version) == ("n1", "1")


def test_the_last_valid_value_stays_and_a_valid_value_converges() -> None:
    first = validate_nodeslo(nodeslo(threshold({"cpuSuppressThresholdPercent": 80})))
    bad = validate_nodeslo(nodeslo(threshold({"cpuSuppressThresholdPercent": 150}), "2"), first)
    assert suppress(bad) == 80
    still = validate_nodeslo(nodeslo(threshold({"cpuSuppressThresholdPercent": 150}), "3"), bad)
    assert suppress(still) == 80  # the fallback of a fallback is still the last valid value
    good = validate_nodeslo(nodeslo(threshold({"cpuSuppressThresholdPercent": 50}), "4"), still)
    assert (suppress(good), good.problems) == (50, ())


def test_an_unset_field_is_the_default_not_the_last_value() -> None:
    first = validate_nodeslo(nodeslo(threshold({"cpuSuppressThresholdPercent": 80})))
    assert suppress(validate_nodeslo(nodeslo({}), first)) == 65


BE = ("resourceQOSStrategy", "beClass")


def be(block: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"resourceQOSStrategy": {"beClass": {block: {"enable": True, **values}}}}


@pytest.mark.parametrize(
    ("spec", "path", "rule"),
    [
        (be("resctrlQOS", {"catRangeEndPercent": 101}), "resctrlQOS.catRangeEndPercent", "[0, 100]"),
        (be("resctrlQOS", {"catRangeStartPercent": -1}), "resctrlQOS.catRangeStartPercent", "[0, 100]"),
        (
            be("resctrlQOS", {"catRangeStartPercent": 50, "catRangeEndPercent": 30}),
            "resctrlQOS.catRangeStartPercent",
            "below catRangeEndPercent (30)",
        ),
        (
            be("resctrlQOS", {"catRangeStartPercent": 40, "catRangeEndPercent": 40}),
            "resctrlQOS.catRangeStartPercent",
            "below catRangeEndPercent (40)",
        ),
        (be("resctrlQOS", {"mbaPercent": 101}), "resctrlQOS.mbaPercent", "[0, 100]"),
        (be("memoryQOS", {"wmarkRatio": 101}), "memoryQOS.wmarkRatio", "[0, 100]"),
        (be("memoryQOS", {"minLimitPercent": 120}), "memoryQOS.minLimitPercent", "[0, 100]"),
        (be("cpuQOS", {"groupIdentity": 3}), "cpuQOS.groupIdentity", "[-1, 2]"),
    ],
)
def test_crd_constraints_are_rejected_and_the_class_keeps_its_defaults(
    spec: dict[str, Any], path: str, rule: str
) -> None:
    v = validate_nodeslo(nodeslo(spec))
    assert len(v.problems) == 1, described(v)
    problem = v.problems[0]
    assert problem.path == "spec.resourceQOSStrategy.beClass." + path
    assert problem.valid == rule
    # the enabled block keeps koordlet's BE defaults: L3 0-30 %, MBA 100, wmarkRatio 95, minLimitPercent 0,
    # groupIdentity -1
    name = path.split(".", maxsplit=1)[0]
    block = v.slo.resource_qos_strategy.be_class.model_dump(by_alias=True)[name]  # type: ignore[union-attr]
    defaults = {
        "resctrlQOS": {"catRangeStartPercent": 0, "catRangeEndPercent": 30, "mbaPercent": 100},
        "memoryQOS": {"wmarkRatio": 95, "minLimitPercent": 0},
        "cpuQOS": {"groupIdentity": -1},
    }[name]
    assert block["enable"] is True
    assert {k: block[k] for k in defaults} == defaults


def test_a_pair_broken_only_by_a_reverted_partner_is_not_another_problem() -> None:
    v = validate_nodeslo(nodeslo(be("resctrlQOS", {"catRangeStartPercent": 40, "catRangeEndPercent": 110})))
    assert [p.path for p in v.problems] == ["spec.resourceQOSStrategy.beClass.resctrlQOS.catRangeEndPercent"]
    resctrl = v.slo.resource_qos_strategy.be_class.resctrl_qos  # type: ignore[union-attr]
    assert resctrl is not None
    assert (resctrl.cat_range_start_percent, resctrl.cat_range_end_percent) == (0, 30)  # a valid pair


@pytest.mark.parametrize(
    ("value", "what", "shown", "rule"),
    [
        ("65", "wrong type", '"65"', "an integer"),
        (65.0, "wrong type", "65.0", "an integer"),
        (math.nan, "wrong type", "NaN", "an integer"),
        (math.inf, "wrong type", "Infinity", "an integer"),
        (True, "wrong type", "true", "an integer"),
        ([65], "wrong type", "[65]", "an integer"),
        (2**70, "out of range", str(2**70), "a 64-bit integer"),
        (-5, "out of range", "-5", "[0, 100]"),
    ],
)
def test_wrong_types_name_path_value_and_rule_without_pydantic_wording(
    value: Any, what: str, shown: str, rule: str
) -> None:
    v = validate_nodeslo(nodeslo(threshold({"cpuSuppressThresholdPercent": value})))
    assert described(v) == [
        f"spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: {what}: {shown} (valid: {rule})"
    ]
    assert suppress(v) == 65
    assert not any(word in described(v)[0] for word in PYDANTIC_WORDS)


def test_enums_objects_maps_and_required_fields() -> None:
    v = validate_nodeslo(
        nodeslo(
            {
                "resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "fast"},
                "resourceQOSStrategy": {"lsClass": 5},
                "cpuBurstStrategy": [],
                "systemStrategy": {"schedFeatures": {"ID_ABSOLUTE_EXPEL": 1}},
                "hostApplications": [{"qos": "LS"}],
            }
        )
    )
    assert sorted(described(v)) == [
        "spec.cpuBurstStrategy: wrong type: [] (valid: an object)",
        "spec.hostApplications[0].name: missing (valid: required)",
        "spec.resourceQOSStrategy.lsClass: wrong type: 5 (valid: an object)",
        'spec.resourceUsedThresholdWithBE.cpuSuppressPolicy: unknown value: "fast" '
        '(valid: one of "cpuset" or "cfsQuota")',
        "spec.systemStrategy.schedFeatures.ID_ABSOLUTE_EXPEL: wrong type: 1 (valid: true or false)",
    ]
    slo = v.slo
    assert slo.resource_used_threshold_with_be.cpu_suppress_policy == "cpuset"  # type: ignore[union-attr]
    assert slo.cpu_burst_strategy.policy == "none"  # type: ignore[union-attr]
    assert slo.system_strategy.sched_features is None  # type: ignore[union-attr]
    assert slo.host_applications == ()


def test_an_invalid_list_item_keeps_the_last_valid_list() -> None:
    apps = [{"name": "db", "qos": "LSR"}]
    first = validate_nodeslo(nodeslo({"hostApplications": apps}))
    v = validate_nodeslo(nodeslo({"hostApplications": [*apps, {"name": 7}]}), first)
    assert [p.path for p in v.problems] == ["spec.hostApplications[1].name"]
    assert [a.name for a in v.slo.host_applications] == ["db"]


def test_a_bare_spec_has_paths_without_the_spec_prefix() -> None:
    v = validate_nodeslo(threshold({"cpuSuppressThresholdPercent": 101}))
    assert [p.path for p in v.problems] == ["resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({**nodeslo({}), "apiVersion": "slo.koordinator.sh/v1beta1"}, "apiVersion: not a NodeSLO's: \"slo."),
        ({**nodeslo({}), "kind": "NodeMetric"}, 'kind: not a NodeSLO: "NodeMetric" (valid: "NodeSLO"'),
        ({"apiVersion": "v1", "kind": "ConfigMap", "data": {"x": "y"}}, 'kind: not a NodeSLO: "ConfigMap"'),
        (["spec"], "not a NodeSLO: wrong type"),
        ({"kind": "NodeSLO", "spec": "nope"}, 'spec: wrong type: "nope" (valid: an object)'),
    ],
)
def test_not_a_nodeslo_at_all(doc: Any, message: str) -> None:
    with pytest.raises(NotANodeSLO) as exc:
        validate_nodeslo(doc)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    "doc",
    [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
            "data": {"colocation-config": "{}"},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "x"},
            "data": {"resource-qos-config": "{}"},
        },
        {"data": {"resource-threshold-config": '{"clusterStrategy": {"enable": true}}'}},
    ],
)
def test_the_slo_controller_config_configmap_is_named_with_what_to_pass_instead(doc: dict[str, Any]) -> None:
    with pytest.raises(NotANodeSLO) as exc:
        validate_nodeslo(doc)
    assert str(exc.value) == SLO_CONTROLLER_CONFIG_HINT
    assert "kubectl get nodeslo <node> -o yaml" in SLO_CONTROLLER_CONFIG_HINT


# -- property: whatever JSON sits in a field, the verdict is valid ----------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = [
    ("resourceUsedThresholdWithBE", "cpuSuppressThresholdPercent"),
    ("resourceUsedThresholdWithBE", "enable"),
    ("resourceUsedThresholdWithBE", "cpuSuppressPolicy"),
    ("resourceUsedThresholdWithBE", "cpuEvictTimeWindowSeconds"),
    ("resourceQOSStrategy", "beClass", "resctrlQOS", "catRangeStartPercent"),
    ("resourceQOSStrategy", "beClass", "resctrlQOS", "catRangeEndPercent"),
    ("resourceQOSStrategy", "lsClass", "memoryQOS", "wmarkRatio"),
    ("resourceQOSStrategy", "lsClass", "memoryQOS", "pageCacheLimitSize"),
    ("resourceQOSStrategy", "beClass", "blkioQOS", "blocks"),
    ("resourceQOSStrategy", "beClass"),
    ("cpuBurstStrategy", "cpuBurstPercent"),
    ("systemStrategy", "schedFeatures"),
    ("hostApplications",),
    ("extensions",),
]


def _put(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        spec = spec.setdefault(key, {})
    spec[path[-1]] = value


def _same(a: Any, b: Any) -> bool:
    """Equal, a NaN (kept as it came in an opaque field, e.g. `extensions`) equal to a NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_same_tells_nan_apart_from_other_values() -> None:
    nan = float("nan")
    assert _same({"x": [nan, 1]}, {"x": [nan, 1]})
    assert not _same({"x": [nan, 1]}, {"x": [0.0, 1]})
    assert not _same({"x": (1,)}, {"x": [1]})
    assert not _same({"x": 1}, {"y": 1})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.tuples(st.sampled_from(_FIELDS), _json), max_size=5), prior=st.booleans())
@example(values=[(("extensions",), {"": float("nan")})], prior=False)  # a NaN kept in an opaque field
def test_any_json_in_any_field_gives_a_nodeslo_that_validates_clean(
    values: list[tuple[tuple[str, ...], Any]], prior: bool
) -> None:
    spec: dict[str, Any] = {}
    for path, value in values:
        try:
            _put(spec, path, value)
        except (TypeError, AttributeError):
            continue  # a parent already holds a non-object: that is the hostile value
    last = validate_nodeslo(nodeslo(be("resctrlQOS", {"catRangeStartPercent": 10}))) if prior else None
    v = validate_nodeslo(nodeslo(spec), last)
    # the applied values (what the next document falls back to) pass the same validator without a problem
    again = validate_nodeslo({"kind": "NodeSLO", "spec": json.loads(json.dumps(dict(v.overlay)))})
    assert again.problems == ()
    assert _same(
        again.slo.model_dump(), v.slo.model_copy(update={"name": "", "resource_version": ""}).model_dump()
    )
    for problem in v.problems:
        assert problem.path.startswith("spec.")
        assert not any(word in problem.describe() for word in PYDANTIC_WORDS)


@pytest.mark.parametrize("value", [2.0, -0.0, False], ids=["float-equal-to-default", "minus-zero", "bool"])
def test_a_wrong_typed_value_equal_to_its_default_is_rejected_alone(value: Any) -> None:
    # 2.0 == 2, -0.0 == 0 and False == 0 in Python: such a value was never reverted, and the whole NodeSLO
    # fell back to its last valid values (the threshold's `enable: true` below was lost)
    field = "groupIdentity" if value == 2 else "schedIdle"
    v = validate_nodeslo(
        nodeslo(
            {
                **threshold({"enable": True}),
                "resourceQOSStrategy": {"lsrClass": {"cpuQOS": {field: value}}},
            }
        )
    )
    assert [p.path for p in v.problems] == [f"spec.resourceQOSStrategy.lsrClass.cpuQOS.{field}"]
    t = v.slo.resource_used_threshold_with_be
    assert t is not None
    assert t.enable is True
