"""Hostile pod data against every annotation parser (issue #15 item 1): nothing but the documented error
type leaves a parser; parse_pod never raises."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koordqos.hooks.cpusetutil import parse_resource_status
from koordqos.hooks.groupidentity import parse_cpu_qos_annotation
from koordqos.hooks.oomscoreadj import target_oom_score_adj
from koordqos.hooks.resources import ExtendedResourceSpecError, extended_from_annotation
from koordqos.hooks.rules import RuleError, topology_view
from koordqos.model.node import parse_node
from koordqos.model.pod import parse_pod
from koordqos.model.qos import QoSClass

NESTED = "[" * 1000 + "]" * 1000
DEEP = '{"a":' * 1000 + "1" + "}" * 1000

# -- deterministic: the reproduction of item 1 against each hook-side parser ------------------------------


@pytest.mark.parametrize("text", [NESTED, DEEP], ids=["lists", "objects"])
def test_hook_parsers_turn_deep_nesting_into_their_error_type(text: str) -> None:
    with pytest.raises(ExtendedResourceSpecError):
        extended_from_annotation({"node.koordinator.sh/extended-resource-spec": text})
    with pytest.raises(ValueError, match="resource-status: invalid JSON"):
        parse_resource_status({"scheduling.koordinator.sh/resource-status": text + " "})
    with pytest.raises(ValueError, match="oom-score-adj-spec: invalid JSON"):
        target_oom_score_adj({"koordinator.sh/oom-score-adj-spec": text}, "c")
    with pytest.raises(ValueError, match="cpuQOS: invalid JSON"):
        parse_cpu_qos_annotation(text)
    with pytest.raises(RuleError):
        topology_view({"node.koordinator.sh/cpu-shared-pools": text})


def test_node_annotations_with_deep_nesting_are_problems() -> None:
    node = parse_node(
        {
            "metadata": {
                "name": "n",
                "annotations": {
                    "node.koordinator.sh/reservation": NESTED,
                    "node.koordinator.sh/system-qos-resource": DEEP,
                },
            }
        }
    )
    assert set(node.ext.problems) >= {
        "node.koordinator.sh/reservation",
        "node.koordinator.sh/system-qos-resource",
    }


# -- property tests -----------------------------------------------------------------------------------------

KEYS = [
    "node.koordinator.sh/extended-resource-spec",
    "scheduling.koordinator.sh/resource-status",
    "koordinator.sh/oom-score-adj-spec",
    "koordinator.sh/oom-score-adj",
    "koordinator.sh/cpuQOS",
    "koordinator.sh/memoryQOS",
    "koordinator.sh/cpuBurst",
    "koordinator.sh/eviction-policy",
    "koordinator.sh/eviction-priority",
    "koordinator.sh/qosClass",
    "koordinator.sh/priority-class",
    "koordinator.sh/priority",
    "koordinator.sh/core-sched-policy",
]

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_json_text = _json_values.map(json.dumps)
_nested = st.tuples(st.sampled_from("[{"), st.integers(1, 3000)).map(
    lambda t: (t[0] if t[0] == "[" else '{"k":') * t[1]
)
_field_shaped = st.fixed_dictionaries(
    {},
    optional={
        "cpuset": st.text(alphabet="0123456789-,", max_size=30) | _json_values,
        "numaNodeResources": _json_values,
        "containers": st.dictionaries(
            st.text(max_size=5),
            st.fixed_dictionaries({}, optional={"requests": _json_values, "limits": _json_values})
            | _json_values,
            max_size=3,
        ),
        "enable": _json_values,
        "groupIdentity": _json_values,
        "c": _json_values,
    },
).map(json.dumps)
annotation_values = st.one_of(st.text(max_size=200), _json_text, _nested, _field_shaped)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.dictionaries(st.sampled_from(KEYS), annotation_values, max_size=len(KEYS)))
def test_arbitrary_annotation_values_never_raise_out_of_parse_pod(values: dict[str, str]) -> None:
    raw = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "labels": values, "annotations": values},
        "spec": {"containers": [{"name": "c"}]},
    }
    pod = parse_pod(raw)
    # every typed accessor works on whatever was parsed
    assert isinstance(pod.qos, QoSClass)
    assert isinstance(pod.eviction_priority, int)
    assert pod.resource_status is None or isinstance(pod.cpuset, str)
    _ = (pod.extended_resource_spec, pod.cpu_qos, pod.memory_qos, pod.cpu_burst, pod.oom_score_adj)
    _ = (pod.oom_score_adj_spec, pod.core_sched_policy, pod.label_priority, pod.eviction_allowed("x"))
    assert set(pod.problems) <= set(KEYS)


@settings(max_examples=120, deadline=None)
@given(value=annotation_values)
def test_hook_parsers_raise_only_their_error_type(value: str) -> None:
    try:
        extended_from_annotation({"node.koordinator.sh/extended-resource-spec": value})
    except ExtendedResourceSpecError:
        pass
    for call in (
        lambda: parse_resource_status({"scheduling.koordinator.sh/resource-status": value}),
        lambda: target_oom_score_adj({"koordinator.sh/oom-score-adj-spec": value}, "c"),
        lambda: target_oom_score_adj({"koordinator.sh/oom-score-adj": value}, "c"),
        lambda: parse_cpu_qos_annotation(value),
    ):
        try:
            call()
        except ValueError:
            pass
    try:
        topology_view(
            {
                "node.koordinator.sh/cpu-shared-pools": value,
                "kubelet.koordinator.sh/cpu-manager-policy": value,
            }
        )
    except RuleError:
        pass


_any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=15), inner, max_size=3),
    max_leaves=30,
)
_pod_like = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "uid": _any_json,
                "name": _any_json,
                "labels": st.dictionaries(st.text(max_size=30), _any_json) | _any_json,
                "annotations": st.dictionaries(st.sampled_from(KEYS), annotation_values) | _any_json,
                "deletionTimestamp": _any_json,
            },
        )
        | _any_json,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": st.lists(
                    st.fixed_dictionaries({}, optional={"name": _any_json, "resources": _any_json})
                    | _any_json,
                    max_size=3,
                )
                | _any_json,
                "initContainers": _any_json,
                "priority": _any_json,
                "nodeName": _any_json,
            },
        )
        | _any_json,
        "status": st.fixed_dictionaries(
            {}, optional={"qosClass": _any_json, "phase": _any_json, "containerStatuses": _any_json}
        )
        | _any_json,
    },
)


@settings(max_examples=120, deadline=None)
@given(raw=_pod_like)
def test_any_json_shaped_pod_parses(raw: dict[str, Any]) -> None:
    pod = parse_pod(raw)
    assert isinstance(pod.uid, str)
    assert isinstance(pod.qos, QoSClass)
    assert pod.request("cpu") >= 0
    assert pod.limit("memory") >= 0


# -- issue #39: numbers koordlet's Go decoding never sees ------------------------------------------------


@pytest.mark.parametrize(
    "pools",
    ['[{"socket": 1e400, "node": 0, "cpuset": "0"}]', '[{"socket": 0, "node": Infinity, "cpuset": "0"}]'],
)
def test_share_pools_with_infinite_ids_are_a_rule_error(pools: str) -> None:
    with pytest.raises(RuleError):
        topology_view({"node.koordinator.sh/cpu-shared-pools": pools})


@pytest.mark.parametrize("ratio", ["inf", "1e400", "Infinity", "nan", "7.5"])
def test_a_non_finite_or_absurd_cpu_normalization_ratio_is_a_node_problem(ratio: str) -> None:
    node = parse_node(
        {"metadata": {"name": "n", "annotations": {"node.koordinator.sh/cpu-normalization-ratio": ratio}}}
    )
    assert node.cpu_normalization_ratio is None
    assert "node.koordinator.sh/cpu-normalization-ratio" in node.problems


@pytest.mark.parametrize(
    "reservation",
    [
        '{"resources": {"cpu": "-4"}}',
        '{"resources": {"cpu": "9223372036854775807"}}',  # cores: past int64 in millicores
        '{"reservedCPUs": "0-3,1000000000-1000065535"}',
        '{"resources": {"memory": NaN}}',
    ],
)
def test_negative_huge_or_non_finite_reservations_are_node_problems(reservation: str) -> None:
    annotations = {"node.koordinator.sh/reservation": reservation}
    node = parse_node({"metadata": {"name": "n", "annotations": annotations}})
    assert node.reservation is None
    assert "node.koordinator.sh/reservation" in node.problems
