"""Pod model: QoS and priority classification (docs/behaviour-qos-manager.md, "QoS and priority classes"),
resources, typed annotations, bad input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos import observability as obs
from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY
from koordqos.model.pod import ContainerInfo, PodInfo, parse_pod
from koordqos.model.problems import forget_problems
from koordqos.model.qos import KubeQoS, PriorityClass, QoSClass, compute_kube_qos, priority_class_of

GI = 1024**3


def raw_pod(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    qos_class: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    uid: str = "uid-1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": "n", "containers": containers or [{"name": "c"}]}
    if init:
        spec["initContainers"] = init
    if priority is not None:
        spec["priority"] = priority
    status: dict[str, Any] = {"phase": "Running"}
    if qos_class:
        status["qosClass"] = qos_class
    return {
        "metadata": {
            "uid": uid,
            "name": "p",
            "namespace": "ns",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": status,
    }


def ctr(
    name: str = "c",
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests or {}, "limits": limits or {}}, **extra}


# -- QoS class ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["LSE", "LSR", "LS", "BE", "SYSTEM"])
def test_qos_label_is_taken_as_is(label: str) -> None:
    pod = parse_pod(raw_pod(labels={"koordinator.sh/qosClass": label}, qos_class="Guaranteed"))
    assert pod.qos_raw is QoSClass(label)
    assert pod.qos is QoSClass(label)


@pytest.mark.parametrize(
    ("kube", "expected"),
    [("Guaranteed", QoSClass.LSR), ("Burstable", QoSClass.LS), ("BestEffort", QoSClass.BE)],
)
def test_qos_falls_back_to_kubernetes_qos(kube: str, expected: QoSClass) -> None:
    pod = parse_pod(raw_pod(qos_class=kube))
    assert pod.qos_raw is QoSClass.NONE
    assert pod.qos is expected


@pytest.mark.parametrize("label", ["ls", "BestEffort", "LS ", "gold"])
def test_malformed_qos_label_is_none_then_kube_fallback_and_reported_once(label: str) -> None:
    forget_problems()
    before = (
        obs.REGISTRY.get_sample_value(
            "koordqos_model_errors_total", {"kind": "pod", "field": "koordinator.sh/qosClass"}
        )
        or 0.0
    )
    raw = raw_pod(labels={"koordinator.sh/qosClass": label}, qos_class="Burstable")
    pod = parse_pod(raw)
    parse_pod(raw)  # the same pod again (e.g. a MODIFIED event): not reported twice
    assert pod.qos_raw is QoSClass.NONE
    assert pod.qos is QoSClass.LS
    assert "koordinator.sh/qosClass" in pod.problems
    after = obs.REGISTRY.get_sample_value(
        "koordqos_model_errors_total", {"kind": "pod", "field": "koordinator.sh/qosClass"}
    )
    assert after == before + 1


def test_empty_qos_label_is_none_without_a_problem() -> None:
    pod = parse_pod(raw_pod(labels={"koordinator.sh/qosClass": ""}, qos_class="BestEffort"))
    assert pod.qos_raw is QoSClass.NONE
    assert pod.qos is QoSClass.BE
    assert pod.problems == {}


def test_annotations_do_not_set_the_qos_class() -> None:
    pod = parse_pod(raw_pod(annotations={"koordinator.sh/qosClass": "BE"}, qos_class="Guaranteed"))
    assert pod.qos is QoSClass.LSR


# -- Kubernetes QoS --------------------------------------------------------------------------------------


def test_status_qos_class_wins_over_computation() -> None:
    pod = parse_pod(raw_pod(qos_class="BestEffort", containers=[ctr(requests={"cpu": "1"})]))
    assert pod.kube_qos is KubeQoS.BESTEFFORT


@pytest.mark.parametrize(
    ("containers", "init", "expected"),
    [
        ([ctr()], None, KubeQoS.BESTEFFORT),
        ([ctr(requests={BATCH_CPU: "1000", BATCH_MEMORY: "1Gi"})], None, KubeQoS.BESTEFFORT),
        (
            [ctr(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"})],
            None,
            KubeQoS.GUARANTEED,
        ),
        (
            [ctr(requests={"cpu": "1000m", "memory": "1024Mi"}, limits={"cpu": "1", "memory": "1Gi"})],
            None,
            KubeQoS.GUARANTEED,
        ),
        (
            [ctr(requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"})],
            None,
            KubeQoS.BURSTABLE,
        ),
        ([ctr(limits={"cpu": "1"})], None, KubeQoS.BURSTABLE),
        (
            [ctr(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"}), ctr("b")],
            None,
            KubeQoS.BURSTABLE,
        ),
        (
            [ctr(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"})],
            [ctr("init", requests={"cpu": "1"})],
            KubeQoS.BURSTABLE,
        ),
        ([ctr()], [ctr("init", requests={"memory": "1Gi"})], KubeQoS.BURSTABLE),
    ],
)
def test_kube_qos_is_computed_when_status_has_none(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None, expected: KubeQoS
) -> None:
    assert parse_pod(raw_pod(containers=containers, init=init)).kube_qos is expected


def test_compute_kube_qos_direct() -> None:
    c = ContainerInfo(name="c", requests={"cpu": 1000, "memory": GI}, limits={"cpu": 1000, "memory": GI})
    assert compute_kube_qos([c]) is KubeQoS.GUARANTEED
    assert compute_kube_qos([]) is KubeQoS.BESTEFFORT


# -- priority classes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        (9000, PriorityClass.PROD),
        (9999, PriorityClass.PROD),
        (10000, PriorityClass.NONE),
        (8999, PriorityClass.NONE),
        (7000, PriorityClass.MID),
        (7999, PriorityClass.MID),
        (5000, PriorityClass.BATCH),
        (5999, PriorityClass.BATCH),
        (3000, PriorityClass.FREE),
        (3999, PriorityClass.FREE),
        (2999, PriorityClass.NONE),
        (0, PriorityClass.NONE),
        (None, PriorityClass.NONE),
        (-5, PriorityClass.NONE),
    ],
)
def test_priority_class_ranges(priority: int | None, expected: PriorityClass) -> None:
    assert priority_class_of(priority) is expected


def test_priority_class_label_wins_over_spec_priority() -> None:
    pod = parse_pod(raw_pod(labels={"koordinator.sh/priority-class": "koord-mid"}, priority=9500))
    assert pod.priority_class_raw is PriorityClass.MID
    assert pod.priority_class is PriorityClass.MID


def test_invalid_priority_class_label_is_none_not_the_spec_range() -> None:
    pod = parse_pod(
        raw_pod(labels={"koordinator.sh/priority-class": "koord-gold"}, priority=5500, qos_class="Burstable")
    )
    assert pod.priority_class_raw is PriorityClass.NONE
    assert pod.priority_class is PriorityClass.PROD  # default from QoS LS
    assert "koordinator.sh/priority-class" in pod.problems


@pytest.mark.parametrize(
    ("labels", "kube", "priority", "cls", "value"),
    [
        ({}, "BestEffort", None, PriorityClass.BATCH, 5500),  # unlabeled BestEffort → batch default
        ({"koordinator.sh/qosClass": "LS"}, "Burstable", None, PriorityClass.PROD, 9500),
        ({"koordinator.sh/qosClass": "SYSTEM"}, "Burstable", None, PriorityClass.PROD, 9500),
        ({"koordinator.sh/qosClass": "LSE"}, "Guaranteed", None, PriorityClass.PROD, 9500),
        ({"koordinator.sh/qosClass": "BE"}, "BestEffort", 0, PriorityClass.BATCH, 5500),  # 0 → default
        ({"koordinator.sh/qosClass": "BE"}, "BestEffort", 5100, PriorityClass.BATCH, 5100),
        ({}, "Guaranteed", 100, PriorityClass.PROD, 100),  # out-of-range priority: class by QoS, value kept
        ({"koordinator.sh/priority-class": "koord-free"}, "BestEffort", None, PriorityClass.FREE, 3500),
    ],
)
def test_priority_class_and_value_with_defaults(
    labels: dict[str, str], kube: str, priority: int | None, cls: PriorityClass, value: int
) -> None:
    pod = parse_pod(raw_pod(labels=labels, qos_class=kube, priority=priority))
    assert pod.priority_class is cls
    assert pod.priority_value == value


@pytest.mark.parametrize(
    ("label", "sub", "label_priority"),
    [(None, 0, 5500), ("1200", 1200, 1200), ("-3", -3, -3), ("high", 0, 5500)],
)
def test_sub_priority_label(label: str | None, sub: int, label_priority: int) -> None:
    labels = {"koordinator.sh/qosClass": "BE"}
    if label is not None:
        labels["koordinator.sh/priority"] = label
    pod = parse_pod(raw_pod(labels=labels, qos_class="BestEffort"))
    assert pod.sub_priority == sub
    assert pod.label_priority == label_priority
    assert ("koordinator.sh/priority" in pod.problems) == (label == "high")


# -- eviction keys (docs/behaviour-qos-manager.md, "Eviction candidates") ------------------------------------


@pytest.mark.parametrize(
    ("annotation", "cpu_allowed", "mem_allowed"),
    [
        (None, True, True),
        ('["BEMemoryEvict","CPUEvict"]', True, False),
        ('["cpuevict"]', False, False),
        ("not json", False, False),
        ('{"CPUEvict": true}', False, False),
        ("", False, False),
        ("[]", False, False),
    ],
)
def test_eviction_policy_annotation(annotation: str | None, cpu_allowed: bool, mem_allowed: bool) -> None:
    ann = {} if annotation is None else {"koordinator.sh/eviction-policy": annotation}
    pod = parse_pod(raw_pod(annotations=ann))
    assert pod.eviction_allowed("CPUEvict") is cpu_allowed
    assert pod.eviction_allowed("MemoryEvict") is mem_allowed


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 0), ("-1", -1), ("100", 100), ("abc", 0), ("99999999999", 0), ("1.5", 0)]
)
def test_eviction_priority_annotation(value: str | None, expected: int) -> None:
    ann = {} if value is None else {"koordinator.sh/eviction-priority": value}
    assert parse_pod(raw_pod(annotations=ann)).eviction_priority == expected


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("True", False), ("false", False), (None, False)]
)
def test_eviction_enabled_label(value: str | None, expected: bool) -> None:
    labels = {} if value is None else {"koordinator.sh/eviction-enabled": value}
    assert parse_pod(raw_pod(labels=labels)).eviction_enabled is expected


# -- resources ------------------------------------------------------------------------------------------


def test_resources_in_agent_units_and_deprecated_batch_names() -> None:
    pod = parse_pod(
        raw_pod(
            containers=[
                ctr(
                    "a",
                    requests={"cpu": "250m", "memory": "512Mi", BATCH_CPU: "2000", BATCH_MEMORY: "2Gi"},
                    limits={BATCH_CPU: "2000", BATCH_MEMORY: "2Gi"},
                ),
                ctr(
                    "b",
                    requests={"koordinator.sh/batch-cpu": "500", "koordinator.sh/batch-memory": "1Gi"},
                    limits={"koordinator.sh/batch-cpu": "1000"},
                ),
            ]
        )
    )
    assert pod.request("cpu") == 250
    assert pod.request("memory") == 512 * 1024**2
    assert pod.request(BATCH_CPU) == 2500
    assert pod.request(BATCH_MEMORY) == 3 * GI
    assert pod.limit(BATCH_CPU) == 3000
    assert pod.limit(BATCH_MEMORY) == 0  # container b has no batch-memory limit
    a = pod.container("a")
    assert a is not None
    assert a.requests[BATCH_CPU] == 2000


def test_kubernetes_deprecated_name_loses_to_the_current_one() -> None:
    pod = parse_pod(raw_pod(containers=[ctr(requests={BATCH_CPU: "100", "koordinator.sh/batch-cpu": "900"})]))
    assert pod.request(BATCH_CPU) == 100


def test_sidecars_count_and_init_containers_follow_kubernetes_rules() -> None:
    pod = parse_pod(
        raw_pod(
            containers=[ctr("main", requests={"cpu": "1"}, limits={"cpu": "2"})],
            init=[
                ctr("setup", requests={"cpu": "3"}, limits={"cpu": "3"}),
                ctr("proxy", requests={"cpu": "500m"}, limits={"cpu": "1"}, restartPolicy="Always"),
            ],
        )
    )
    assert pod.request("cpu") == 1500  # main + native sidecar
    assert pod.limit("cpu") == 3000
    assert pod.kube_request("cpu") == 3000  # the init container dominates
    proxy = pod.container("proxy")
    assert proxy is not None
    assert proxy.sidecar
    setup = pod.container("setup")
    assert setup is not None
    assert not setup.sidecar


def test_malformed_quantity_is_left_out_and_reported() -> None:
    pod = parse_pod(raw_pod(containers=[ctr(requests={"cpu": "lots", "memory": "1Gi"})]))
    assert pod.request("cpu") == 0
    assert pod.request("memory") == GI
    assert any("resources" in k for k in pod.problems)


def test_container_ids_states_and_metadata() -> None:
    raw = raw_pod(containers=[ctr("a"), ctr("b")])
    raw["status"]["containerStatuses"] = [
        {"name": "a", "containerID": "containerd://abc", "state": {"running": {}}},
        {"name": "b", "containerID": "", "state": {"waiting": {"reason": "ContainerCreating"}}},
    ]
    raw["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    pod = parse_pod(raw)
    a, b = pod.containers
    assert (a.container_id, a.runtime_id, a.runtime, a.state) == (
        "containerd://abc",
        "abc",
        "containerd",
        "running",
    )
    assert (b.container_id, b.runtime_id, b.state) == ("", "", "waiting")
    assert pod.deleting
    assert pod.node_name == "n"
    assert pod.phase == "Running"
    assert pod.active


# -- typed annotations ----------------------------------------------------------------------------------


def test_resource_status_cpuset_and_numa() -> None:
    value = '{"cpuset":"2-4","numaNodeResources":[{"node":1,"resources":{"cpu":"2"}}]}'
    ann = {"scheduling.koordinator.sh/resource-status": value}
    pod = parse_pod(raw_pod(annotations=ann))
    rs = pod.resource_status
    assert rs is not None
    assert rs.cpus == (2, 3, 4)
    assert pod.cpuset == "2-4"
    assert rs.numa_node_resources[0].node == 1
    assert rs.numa_node_resources[0].resources["cpu"] == 2000
    assert rs.numa_aware


@pytest.mark.parametrize(
    ("value", "aware"),
    [
        ('{"numaNodeResources":[{"node":0}]}', False),
        ('{"numaNodeResources":[{"node":1,"resources":{"kubernetes.io/batch-cpu":"2000"}}]}', True),
        ('{"numaNodeResources":[{"node":1,"resources":{"hugepages-1Gi":"2Gi"}}]}', False),
    ],
)
def test_numa_awareness(value: str, aware: bool) -> None:
    rs = parse_pod(raw_pod(annotations={"scheduling.koordinator.sh/resource-status": value})).resource_status
    assert rs is not None
    assert rs.numa_aware is aware


@pytest.mark.parametrize("value", ["bad-format", '{"cpuset": 5}', '{"cpuset": "4-2"}', "[]"])
def test_malformed_resource_status_is_absent_with_a_problem(value: str) -> None:
    pod = parse_pod(raw_pod(annotations={"scheduling.koordinator.sh/resource-status": value}))
    assert pod.resource_status is None
    assert pod.cpuset == ""
    assert "scheduling.koordinator.sh/resource-status" in pod.problems


def test_extended_resource_spec_keeps_nil_requests_apart_from_empty() -> None:
    value = (
        '{"containers":{"c0":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"2Gi"},'
        '"limits":{"kubernetes.io/batch-cpu":"500"}},"c1":{"limits":{"kubernetes.io/batch-cpu":"1000"}}}}'
    )
    spec = parse_pod(
        raw_pod(annotations={"node.koordinator.sh/extended-resource-spec": value})
    ).extended_resource_spec
    assert spec is not None
    assert spec["c0"].requests == {BATCH_CPU: 500, BATCH_MEMORY: 2 * GI}
    assert spec["c1"].requests is None
    assert spec["c1"].limits == {BATCH_CPU: 1000}


@pytest.mark.parametrize(
    ("value", "gi", "enable", "problem"),
    [
        ('{"enable":true,"groupIdentity":-1}', -1, True, False),
        ('{"enable":false}', None, False, False),
        ('{"groupIdentity":3}', None, None, True),
        ("{bad", None, None, True),
    ],
)
def test_cpu_qos_annotation(value: str, gi: int | None, enable: bool | None, problem: bool) -> None:
    pod = parse_pod(raw_pod(annotations={"koordinator.sh/cpuQOS": value}))
    if problem:
        assert pod.cpu_qos is None
        assert "koordinator.sh/cpuQOS" in pod.problems
    else:
        assert pod.cpu_qos is not None
        assert (pod.cpu_qos.group_identity, pod.cpu_qos.enable) == (gi, enable)


@pytest.mark.parametrize(
    ("pod_value", "spec_value", "adj", "spec", "bad"),
    [
        (None, None, None, None, set()),
        ("-500", None, -500, None, set()),
        ("-500", '{"c1":100}', -500, {"c1": 100}, set()),
        (None, "{invalid}", None, None, {"koordinator.sh/oom-score-adj-spec"}),
        ("not-a-number", None, None, None, {"koordinator.sh/oom-score-adj"}),
    ],
)
def test_oom_score_adj_annotations(
    pod_value: str | None, spec_value: str | None, adj: int | None, spec: dict[str, int] | None, bad: set[str]
) -> None:
    ann = {}
    if pod_value is not None:
        ann["koordinator.sh/oom-score-adj"] = pod_value
    if spec_value is not None:
        ann["koordinator.sh/oom-score-adj-spec"] = spec_value
    pod = parse_pod(raw_pod(annotations=ann))
    assert pod.oom_score_adj == adj
    assert pod.oom_score_adj_spec == spec
    assert set(pod.problems) == bad


@pytest.mark.parametrize(
    ("policy", "expected", "bad"),
    [("", "", False), ("none", "none", False), ("exclusive", "exclusive", False), ("shared", "", True)],
)
def test_core_sched_labels(policy: str, expected: str, bad: bool) -> None:
    labels = {"koordinator.sh/core-sched-group-id": "group-xxx", "koordinator.sh/core-sched-policy": policy}
    pod = parse_pod(raw_pod(labels=labels))
    assert (pod.core_sched_group_id, pod.core_sched_policy) == ("group-xxx", expected)
    assert ("koordinator.sh/core-sched-policy" in pod.problems) is bad


def test_memory_qos_and_cpu_burst_annotations() -> None:
    ann = {
        "koordinator.sh/memoryQOS": '{"policy":"auto","throttlingPercent":90}',
        "koordinator.sh/cpuBurst": '{"policy":"cpuBurstOnly","cpuBurstPercent":500}',
    }
    pod = parse_pod(raw_pod(annotations=ann))
    assert pod.memory_qos is not None
    assert pod.memory_qos.policy == "auto"
    assert pod.memory_qos.throttling_percent == 90
    assert pod.cpu_burst is not None
    assert pod.cpu_burst.cpu_burst_percent == 500
    bad = parse_pod(raw_pod(annotations={"koordinator.sh/cpuBurst": '{"policy":"turbo"}'}))
    assert bad.cpu_burst is None
    assert "koordinator.sh/cpuBurst" in bad.problems


def test_direct_construction_gets_the_same_accessors() -> None:
    pod = PodInfo(
        uid="u",
        labels={"koordinator.sh/eviction-enabled": "true"},
        annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"0-1"}'},
    )
    assert pod.eviction_enabled
    assert pod.cpuset == "0-1"


_text = st.text(max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.dictionaries(
        st.sampled_from(
            [
                "koordinator.sh/qosClass",
                "koordinator.sh/priority-class",
                "koordinator.sh/priority",
                "koordinator.sh/eviction-enabled",
                "koordinator.sh/core-sched-policy",
                "x",
            ]
        ),
        _text,
    ),
    annotations=st.dictionaries(
        st.sampled_from(
            [
                "scheduling.koordinator.sh/resource-status",
                "node.koordinator.sh/extended-resource-spec",
                "koordinator.sh/cpuQOS",
                "koordinator.sh/memoryQOS",
                "koordinator.sh/cpuBurst",
                "koordinator.sh/eviction-priority",
                "koordinator.sh/eviction-policy",
                "koordinator.sh/oom-score-adj",
                "koordinator.sh/oom-score-adj-spec",
            ]
        ),
        _text,
    ),
    priority=st.one_of(st.none(), st.integers(-(2**31), 2**31)),
    cpu=st.one_of(_text, st.integers(), st.floats(allow_nan=True)),
)
def test_any_labels_and_annotations_classify_without_raising(
    labels: dict[str, str], annotations: dict[str, str], priority: int | None, cpu: Any
) -> None:
    raw = raw_pod(
        labels=labels, annotations=annotations, priority=priority, containers=[ctr(requests={"cpu": cpu})]
    )
    pod = parse_pod(raw)
    assert isinstance(pod.qos, QoSClass)
    assert pod.qos is not QoSClass.NONE
    assert isinstance(pod.priority_class, PriorityClass)
    assert isinstance(pod.priority_value, int)
    assert isinstance(pod.eviction_priority, int)
    assert pod.request("cpu") >= 0
    assert all(isinstance(v, str) for v in pod.problems.values())
