"""koordlet's predictor test vectors (docs/prediction.md, "Reading a model", "Pod-based predictor",
"Priority-based predictor" and "Min predictor"): margin 10 %, cold start 1 h."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from koordqos.model.node import NodeInfo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.prediction.model import SYS_UID, Estimate, Prediction, PredictionParams, class_uid
from koordqos.prediction.predictors import (
    MinPredictor,
    PodPredictor,
    PredictError,
    PriorityPredictor,
    node_allocatable,
    scale,
)

Mi = 1 << 20
Gi = 1 << 30
NOW = 1767225600.0  # 2026-01-01T00:00:00Z
PARAMS = PredictionParams(cold_start_seconds=3600.0)


def pred(p95: tuple[int, int], p98: tuple[int, int]) -> Prediction:
    return {"p95": Estimate(*p95), "p98": Estimate(*p98)}


SYS = pred((300, 512 * Mi), (500, 512 * Mi))
PROD = pred((1000, Gi), (1200, Gi))
POD_PRED = pred((500, 768 * Mi), (1000, Gi))
TEST_PRED = pred((500, 512 * Mi), (800, 768 * Mi))
EMPTY = pred((0, 0), (0, 0))


def lookup(table: Mapping[str, Prediction], pods: Prediction | None) -> object:
    """The mock of the upstream tests: node-level UIDs from `table`, any other UID missing from it returns
    an empty prediction with no error; pods get `pods` (None: the lookup fails for them)."""

    def get(uid: str) -> Prediction | None:
        if uid in table:
            return table[uid]
        if uid.startswith("__node"):
            return EMPTY
        return pods

    return get


def pod(
    uid: str,
    cpu: str,
    mem: str,
    *,
    priority: str = "koord-prod",
    age_s: float = 7200,
    deleting: bool = False,
) -> PodInfo:
    raw = {
        "metadata": {
            "uid": uid,
            "name": uid,
            "namespace": "default",
            "labels": {"koordinator.sh/priority-class": priority},
            "creationTimestamp": _rfc3339(NOW - age_s),
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]},
        "status": {"phase": "Running"},
    }
    if deleting:
        raw["metadata"]["deletionTimestamp"] = _rfc3339(NOW)  # type: ignore[index]
    return parse_pod(raw)


def _rfc3339(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(cpu: str, mem: str, annotations: Mapping[str, str] | None = None) -> NodeInfo:
    from koordqos.model.node import parse_node

    return parse_node(
        {
            "metadata": {"name": "n", "annotations": dict(annotations or {})},
            "status": {"allocatable": {"cpu": cpu, "memory": mem}, "capacity": {"cpu": cpu, "memory": mem}},
        }
    )


PODS_A = [
    pod("cold", "1000m", "1Gi", age_s=600),
    pod("prod", "2000m", "2Gi"),
    pod("deleting", "2000m", "2Gi", deleting=True),
]


def test_margins() -> None:
    assert scale(500, 10) == 550
    assert scale(768 * Mi, 10) == 885837004
    assert scale(Gi, 10) == 1181116006
    assert scale(1300, 10) == 1430
    assert scale(1536 * Mi, 10) == 1771674009
    assert scale(1035, 10) == 1138  # 1138.5 truncated


@pytest.mark.parametrize(
    ("alloc", "pod_result", "priority_result", "combined"),
    [
        (("3000m", "3Gi"), (1450, 966367642), (1570, 1449551463), (1450, 966367642)),
        (("8000m", "8Gi"), (1450, 966367642), (1570, 1449551463), (1450, 966367642)),
        (("1000m", "1Gi"), (450, 0), (0, 0), (0, 0)),
    ],
)
def test_a_min_predictor(
    alloc: tuple[str, str],
    pod_result: tuple[int, int],
    priority_result: tuple[int, int],
    combined: tuple[int, int],
) -> None:
    get = lookup({SYS_UID: SYS, class_uid("koord-prod"): PROD}, POD_PRED)
    mp = MinPredictor(get, PARAMS, NOW)  # type: ignore[arg-type]
    for p in PODS_A:
        mp.add_pod(p)
    n = node(*alloc)
    assert mp.pods.result(n) == {"cpu": pod_result[0], "memory": pod_result[1]}
    assert mp.priority.result(n) == {"cpu": priority_result[0], "memory": priority_result[1]}
    assert mp.result(n) == {"cpu": combined[0], "memory": combined[1]}
    assert mp.pods.peak() == {"cpu": 1550, "memory": 2254857830}
    assert mp.priority.peak() == {"cpu": 1430, "memory": 1771674009}
    assert mp.peak() == {"cpu": 1550, "memory": 2254857830}


@pytest.mark.parametrize(
    ("alloc", "result"), [(("3000m", "3Gi"), (1450, 1261646644)), (("1000m", "1Gi"), (450, 187904820))]
)
def test_b_pod_predictor(alloc: tuple[str, str], result: tuple[int, int]) -> None:
    pp = PodPredictor(lookup({}, TEST_PRED), PARAMS, NOW)  # type: ignore[arg-type]
    for p in (*PODS_A, pod("batch", "1000m", "1Gi", priority="koord-batch")):
        pp.add_pod(p)
    assert pp.result(node(*alloc)) == {"cpu": result[0], "memory": result[1]}


def test_c_pod_predictor_peak_counts_cold_and_unpredicted_requests() -> None:
    table = {"normal": TEST_PRED}
    pp = PodPredictor(table.get, PARAMS, NOW)
    pp.add_pod(pod("cold", "1000m", "1Gi", age_s=600))
    pp.add_pod(pod("normal", "2000m", "2Gi"))
    with pytest.raises(PredictError):
        pp.add_pod(pod("missing", "500m", "512Mi"))
    assert pp.peak() == {"cpu": 2050, "memory": 2496449740}


@pytest.mark.parametrize(
    ("alloc", "result"), [(("3000m", "3Gi"), (200, 536870912)), (("900m", "1Gi"), (100, 0))]
)
def test_d_priority_predictor_margin_zero(alloc: tuple[str, str], result: tuple[int, int]) -> None:
    prod = pred((500, 768 * Mi), (800, Gi))
    get = lookup({SYS_UID: SYS, class_uid("koord-prod"): prod}, None)
    pp = PriorityPredictor(get, PredictionParams(safety_margin_percent=0))  # type: ignore[arg-type]
    pp.add_pod(pod("prod", "1000m", "2Gi"))
    pp.add_pod(pod("batch", "3000m", "3Gi", priority="koord-batch"))
    assert pp.result(node(*alloc)) == {"cpu": result[0], "memory": result[1]}
    assert pp.peak() == {"cpu": 800, "memory": 1610612736}


def test_cold_start_counts_equality_and_is_checked_before_deletion() -> None:
    pp = PodPredictor(lambda uid: None, PARAMS, NOW)
    pp.add_pod(pod("edge", "100m", "1Mi", age_s=3600))  # exactly the cold-start duration: cold
    pp.add_pod(pod("cold-deleting", "200m", "2Mi", age_s=10, deleting=True))
    assert pp.peak() == {"cpu": 300, "memory": 3 * Mi}


def test_a_pod_twice_is_an_error_and_other_classes_are_ignored() -> None:
    pp = PodPredictor(lambda uid: TEST_PRED, PARAMS, NOW)
    pp.add_pod(pod("a", "1", "1Gi"))
    with pytest.raises(PredictError):
        pp.add_pod(pod("a", "1", "1Gi"))
    pp.add_pod(pod("m", "1", "1Gi", priority="koord-mid"))
    assert pp.peak() == {"cpu": 550, "memory": 885837004}


def test_an_unpredicted_pod_is_hidden_from_the_priority_predictor() -> None:
    """minPredictor stops at the first error (docs/prediction.md, "Min predictor")."""
    get = lookup({SYS_UID: SYS, class_uid("koord-prod"): PROD}, None)
    mp = MinPredictor(get, PARAMS, NOW)  # type: ignore[arg-type]
    with pytest.raises(PredictError):
        mp.add_pod(pod("x", "2", "2Gi"))
    assert mp.priority.reclaim_request == {"cpu": 0, "memory": 0}


def test_priority_predictor_fails_without_models() -> None:
    mp = MinPredictor(lambda uid: None, PARAMS, NOW)
    with pytest.raises(PredictError):
        mp.result(node("1", "1Gi"))


def test_node_allocatable_prefers_raw_allocatable() -> None:
    raw = '{"cpu": "6", "memory": "12Gi"}'
    assert node_allocatable(node("8", "16Gi", {"node.koordinator.sh/raw-allocatable": raw})) == {
        "cpu": 6000,
        "memory": 12 * Gi,
    }
    bad = node("8", "16Gi", {"node.koordinator.sh/raw-allocatable": '{"cpu": "lots"}'})
    assert node_allocatable(bad) == {"cpu": 8000, "memory": 16 * Gi}
    with pytest.raises(PredictError):
        node_allocatable(None)
