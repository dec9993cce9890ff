"""Pod annotation parsing is total (issue #15 item 1): one bad annotation is ignored, logged once with the
pod and key, counted; the pod keeps the rest of its data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from koordqos import observability as obs
from koordqos.model.pod import parse_pod
from koordqos.model.problems import forget_problems
from koordqos.model.qos import QoSClass

NESTED = "[" * 1000 + "]" * 1000  # ~1.2 KB: json.loads raises RecursionError
NESTED_OBJECT = '{"a":' * 1000 + "1" + "}" * 1000

JSON_ANNOTATIONS = [
    "node.koordinator.sh/extended-resource-spec",
    "scheduling.koordinator.sh/resource-status",
    "koordinator.sh/oom-score-adj-spec",
    "koordinator.sh/cpuQOS",
    "koordinator.sh/memoryQOS",
    "koordinator.sh/cpuBurst",
    "koordinator.sh/eviction-policy",
]

GOOD = {
    "koordinator.sh/eviction-priority": "7",
    "koordinator.sh/oom-score-adj": "-5",
    "node.koordinator.sh/extended-resource-spec": json.dumps(
        {"containers": {"c": {"requests": {"kubernetes.io/batch-cpu": "500"}}}}
    ),
}


def _pod(annotations: dict[str, str], uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "name": f"p-{uid}",
            "namespace": "ns",
            "labels": {"koordinator.sh/qosClass": "BE"},
            "annotations": annotations,
        },
        "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def _count(key: str) -> float:
    value = obs.REGISTRY.get_sample_value("koordqos_model_errors_total", {"kind": "pod", "field": key})
    return value or 0.0


@pytest.mark.parametrize("key", JSON_ANNOTATIONS)
@pytest.mark.parametrize("bad", [NESTED, NESTED_OBJECT], ids=["lists", "objects"])
def test_deeply_nested_annotation_is_ignored_logged_once_counted_and_the_rest_kept(
    key: str, bad: str
) -> None:
    forget_problems()
    annotations = {**GOOD, key: bad}
    before = _count(key)
    with capture_logs() as logs:
        pod = parse_pod(_pod(annotations, uid=f"u-{key}"))
        again = parse_pod(_pod(annotations, uid=f"u-{key}"))  # a MODIFIED event: not reported twice
    assert key in pod.problems
    assert key in again.problems
    assert _count(key) == before + 1
    reported = [e for e in logs if e.get("field") == key]
    assert len(reported) == 1
    assert reported[0]["object"] == f"ns/p-u-{key}"
    assert reported[0]["uid"] == f"u-{key}"
    # everything else of the pod is still there
    assert pod.qos is QoSClass.BE
    assert pod.eviction_priority == 7
    assert pod.oom_score_adj == -5
    if key != "node.koordinator.sh/extended-resource-spec":
        spec = pod.extended_resource_spec
        assert spec is not None
        assert spec["c"].requests == {"kubernetes.io/batch-cpu": 500}
    if key == "koordinator.sh/eviction-policy":
        assert not pod.eviction_allowed("BECPUEvict")  # malformed policy: no eviction, as before
    if key == "koordinator.sh/oom-score-adj-spec":
        assert pod.oom_score_adj_spec is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("koordinator.sh/eviction-priority", "9" * 5000),  # int() refuses: digit limit
        ("koordinator.sh/oom-score-adj", "9" * 5000),
        ("scheduling.koordinator.sh/resource-status", json.dumps({"cpuset": "0-" + "9" * 5000})),
        ("scheduling.koordinator.sh/resource-status", json.dumps({"numaNodeResources": [{"node": 1e308}]})),
        ("koordinator.sh/cpuQOS", json.dumps({"groupIdentity": [1]})),
        ("node.koordinator.sh/extended-resource-spec", json.dumps({"containers": {"c": {"limits": [1]}}})),
        ("koordinator.sh/oom-score-adj-spec", json.dumps([1, 2])),
    ],
    ids=[
        "huge-priority",
        "huge-oom",
        "huge-cpuset",
        "float-node",
        "wrong-type-gi",
        "list-limits",
        "list-spec",
    ],
)
def test_huge_or_wrongly_typed_values_are_one_problem_each(key: str, value: str) -> None:
    pod = parse_pod(_pod({key: value}, uid=f"w-{key}"))
    assert list(pod.problems) == [key]
    assert pod.qos is QoSClass.BE  # the label is still read


def test_a_failure_no_parser_foresaw_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    # any exception type from a parser (here: the decoder itself failing oddly) stays with its annotation
    from koordqos.model import jsontext

    def broken(raw: str | bytes) -> Any:
        if "boom" in str(raw):
            raise LookupError("decoder bug")
        return json.loads(raw)

    monkeypatch.setattr(jsontext, "loads", broken)
    pod = parse_pod(
        _pod({"koordinator.sh/cpuBurst": '{"boom": 1}', "koordinator.sh/cpuQOS": '{"enable": true}'}, "u-x")
    )
    assert "LookupError" in pod.problems["koordinator.sh/cpuBurst"]
    assert pod.cpu_burst is None
    assert pod.cpu_qos is not None
    assert pod.cpu_qos.enable is True


@pytest.mark.parametrize(
    "raw",
    [
        {"metadata": {"uid": "u", "labels": ["x"], "annotations": "y"}, "spec": [], "status": 5},
        {"metadata": {"uid": ["a" * 3] * 3, "name": {"x": 1}}, "spec": {"containers": [{"resources": []}]}},
        {
            "metadata": {"uid": "u"},
            "status": {"qosClass": ["Guaranteed"], "containerStatuses": [{"state": 1}]},
        },
        {"metadata": {"uid": "u", "labels": {"koordinator.sh/qosClass": [[[]]]}}},
    ],
    ids=["wrong-containers", "list-uid", "list-qos-class", "nested-label-value"],
)
def test_wrongly_typed_parts_are_treated_as_absent(raw: dict[str, Any]) -> None:
    pod = parse_pod(raw)
    assert isinstance(pod.qos, QoSClass)
    assert isinstance(pod.uid, str)
