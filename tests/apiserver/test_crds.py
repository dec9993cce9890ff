"""Koordinator's own CRDs (the release's config/crd/bases) on a real server: structural, pruning, status
rules; and the chart's NodeSLO CRD (installed under a test group beside the real one). The examples are an
example NodeMetric status and the NRT worked example (docs/reporting.md, "Status fields" and "Share pools
and reserved CPUs").
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from .conftest import CHART_NODESLO_GROUP
from .controlplane import KOORDINATOR_VERSION, Api, ApiError
from .kubeobjects import NODEMETRIC_PATH, NODESLO_PATH, NRT_PATH, differences, nodeslo, unique

pytestmark = pytest.mark.e2e_apiserver

STATUS_EXAMPLE: dict[str, Any] = {
    "updateTime": "2026-12-01T18:30:00Z",
    "nodeMetric": {
        "nodeUsage": {"resources": {"cpu": "8", "memory": "13Gi"}},
        "aggregatedNodeUsages": [
            {
                "duration": "5m0s",
                "usage": {
                    "avg": {"resources": {"cpu": "8", "memory": "13Gi"}},
                    "p50": {"resources": {"cpu": "7900m", "memory": "13Gi"}},
                    "p90": {"resources": {"cpu": "9200m", "memory": "13312Mi"}},
                    "p95": {"resources": {"cpu": "9800m", "memory": "13312Mi"}},
                    "p99": {"resources": {"cpu": "11200m", "memory": "13568Mi"}},
                },
            },
            {"duration": "30m0s", "usage": {"avg": {}, "p50": {}, "p90": {}, "p95": {}, "p99": {}}},
        ],
        "systemUsage": {"resources": {"cpu": "1200m", "memory": "3Gi"}},
        "aggregatedSystemUsages": [
            {"duration": "5m0s", "usage": {"avg": {"resources": {"cpu": "1200m", "memory": "3Gi"}}}}
        ],
    },
    "podsMetric": [
        {
            "name": "web-0",
            "namespace": "default",
            "priority": "koord-prod",
            "qos": "LS",
            "podUsage": {"resources": {"cpu": "1500m", "memory": "4Gi"}},
            "extensions": {"vendor": {"anything": [1, 2]}},
        }
    ],
    "hostApplicationMetric": [
        {"name": "nginx", "priority": "koord-prod", "qos": "LS", "usage": {"resources": {"cpu": "200m"}}}
    ],
    "prodReclaimableMetric": {"resource": {"resources": {"cpu": "2", "memory": "4Gi"}}},
}

SPEC = {
    "metricCollectPolicy": {
        "aggregateDurationSeconds": 300,
        "reportIntervalSeconds": 60,
        "nodeAggregatePolicy": {"durations": ["5m0s", "10m0s", "30m0s"]},
        "nodeMemoryCollectPolicy": "usageWithoutPageCache",
    }
}


def nodemetric(name: str) -> dict[str, Any]:
    meta = {"name": name}
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": meta, "spec": SPEC}


def test_crds_are_structural_and_established(admin: Api) -> None:
    for name in (
        "nodeslos.slo.koordinator.sh",
        "nodemetrics.slo.koordinator.sh",
        "noderesourcetopologies.topology.node.k8s.io",
        "devices.scheduling.koordinator.sh",
        f"nodeslos.{CHART_NODESLO_GROUP}",
    ):
        crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True", (name, conds)
        assert "NonStructuralSchema" not in conds, (name, conds)


def test_nodemetric_status_round_trip_and_subresource_rules(admin: Api) -> None:
    name = unique("nm")
    created = admin.create(NODEMETRIC_PATH, {**nodemetric(name), "status": STATUS_EXAMPLE})
    assert "status" not in created  # create ignores status: it is a subresource
    assert created["spec"] == SPEC

    # status PUT through the subresource: stored exactly as sent (nothing pruned)
    created["status"] = STATUS_EXAMPLE
    stored = admin.put(f"{NODEMETRIC_PATH}/{name}/status", created)
    assert stored["status"] == STATUS_EXAMPLE, differences(stored["status"], STATUS_EXAMPLE)
    assert admin.get(f"{NODEMETRIC_PATH}/{name}")["status"] == STATUS_EXAMPLE

    # a main-resource PUT changes the spec and leaves the status as it was
    changed = copy.deepcopy(stored)
    changed["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 30
    changed["status"]["updateTime"] = "2000-01-01T00:00:00Z"
    after = admin.put(f"{NODEMETRIC_PATH}/{name}", changed)
    assert after["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 30
    assert after["status"] == STATUS_EXAMPLE

    # and a status PUT leaves the spec as it was
    changed = copy.deepcopy(after)
    changed["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 90
    changed["status"]["updateTime"] = "2026-12-01T18:31:00Z"
    after = admin.put(f"{NODEMETRIC_PATH}/{name}/status", changed)
    assert after["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 30
    assert after["status"]["updateTime"] == "2026-12-01T18:31:00Z"

    # a stale resourceVersion is a 409
    with pytest.raises(ApiError) as conflict:
        admin.put(f"{NODEMETRIC_PATH}/{name}/status", changed)
    assert conflict.value.status == 409


def test_koordinators_nodemetric_has_no_numa_usages_or_prod_peak(admin: Api) -> None:
    """A finding of running against the real CRD: Koordinator's NodeMetric at KOORDINATOR_VERSION has
    `prodReclaimableMetric` but neither `nodeMetric.numaUsages` nor `prodPeakMetric` (both newer): a status
    carrying them is stored without them, so nothing may depend on them round-tripping there."""
    name = unique("nm")
    obj = admin.create(NODEMETRIC_PATH, nodemetric(name))
    status = copy.deepcopy(STATUS_EXAMPLE)
    status["nodeMetric"]["numaUsages"] = [{"numaNodeID": 0, "nodeUsage": {"resources": {"cpu": "4"}}}]
    status["prodPeakMetric"] = {"resource": {"resources": {"cpu": "3"}}}
    obj["status"] = status
    stored = admin.put(f"{NODEMETRIC_PATH}/{name}/status", obj)
    assert sorted(differences(stored["status"], status)) == [
        "pruned .nodeMetric.numaUsages",
        "pruned .prodPeakMetric",
    ], KOORDINATOR_VERSION


def test_nodemetric_prunes_unknown_status_fields(admin: Api) -> None:
    """What a misspelled field in the agent's report would suffer: dropped silently (only a warning)."""
    name = unique("nm")
    obj = admin.create(NODEMETRIC_PATH, nodemetric(name))
    status = copy.deepcopy(STATUS_EXAMPLE)
    status["nodeMetric"]["nodeUsge"] = {"resources": {"cpu": "1"}}  # misspelled
    status["podsMetric"][0]["podUsage"]["resource"] = {"cpu": "1"}  # misspelled inside a ResourceMap
    status["unknownTopLevel"] = 1
    obj["status"] = status
    stored = admin.put(f"{NODEMETRIC_PATH}/{name}/status", obj)
    assert stored["status"] == STATUS_EXAMPLE
    # a wrong type is not pruned but refused
    obj = admin.get(f"{NODEMETRIC_PATH}/{name}")
    obj["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] = "lots"
    with pytest.raises(ApiError) as invalid:
        admin.put(f"{NODEMETRIC_PATH}/{name}/status", obj)
    assert invalid.value.status == 422


NRT_EXAMPLE_ANNOTATIONS = {
    "node.koordinator.sh/cpu-topology": json.dumps(
        {"detail": [{"id": i, "core": i // 2, "socket": 0, "node": i // 4} for i in range(8)]}
    ),
    "node.koordinator.sh/cpu-shared-pools": json.dumps(
        [{"socket": 0, "node": 0, "cpuset": "1"}, {"socket": 0, "node": 1, "cpuset": "4-5"}]
    ),
    "kubelet.koordinator.sh/cpu-manager-policy": '{"policy":"none"}',
    "node.koordinator.sh/pod-cpu-allocs": "null",
}


def nrt_zone(i: int) -> dict[str, Any]:
    return {
        "name": f"node-{i}",
        "type": "Node",
        "resources": [
            {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"},
            {"name": "hugepages-1Gi", "capacity": "0", "allocatable": "0", "available": "0"},
            {"name": "hugepages-2Mi", "capacity": "0", "allocatable": "0", "available": "0"},
            {"name": "memory", **dict.fromkeys(("capacity", "allocatable", "available"), "16375892Ki")},
        ],
    }


def test_nrt_round_trip_prunes_unknown_and_requires_zones(admin: Api) -> None:
    name = unique("nrt")
    body = {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "Koordinator"},
            "annotations": NRT_EXAMPLE_ANNOTATIONS,
        },
        "topologyPolicies": ["None"],
        "zones": [nrt_zone(0), nrt_zone(1)],
    }
    stored = admin.create(NRT_PATH, body)
    assert stored["zones"] == body["zones"]
    assert stored["topologyPolicies"] == ["None"]
    assert stored["metadata"]["annotations"] == NRT_EXAMPLE_ANNOTATIONS

    # the manager's batch resources in a zone survive a full PUT that carries them
    stored["zones"][0]["resources"].append(
        {"name": "kubernetes.io/batch-cpu", "capacity": "3600", "allocatable": "3600", "available": "3600"}
    )
    stored["zones"][1]["misspelled"] = "x"
    after = admin.put(f"{NRT_PATH}/{name}", stored)
    assert "misspelled" not in after["zones"][1]
    assert after["zones"][0]["resources"][-1]["name"] == "kubernetes.io/batch-cpu"

    with pytest.raises(ApiError) as invalid:
        admin.create(NRT_PATH, {**body, "metadata": {"name": unique("nrt")}, "zones": None})
    assert invalid.value.status == 422


CHART_NODESLO_PATH = f"/apis/{CHART_NODESLO_GROUP}/v1alpha1/nodeslos"


def test_chart_nodeslo_crd_keeps_typed_and_unknown_spec_fields(admin: Api) -> None:
    """The chart's NodeSLO CRD (for clusters without Koordinator) preserves unknown spec fields, so objects
    from a newer Koordinator stay whole, and refuses a wrong type as Koordinator's does."""
    name = unique("slo")
    spec = {
        "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65},
        "resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}},
        "someFutureStrategy": {"x": 1},
    }
    body = nodeslo(name, spec)
    body["apiVersion"] = f"{CHART_NODESLO_GROUP}/v1alpha1"
    stored = admin.create(CHART_NODESLO_PATH, body)
    assert stored["spec"] == spec
    for path, version in ((CHART_NODESLO_PATH, f"{CHART_NODESLO_GROUP}/v1alpha1"), (NODESLO_PATH, None)):
        bad = nodeslo(unique("slo"), {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": "high"}})
        if version:
            bad["apiVersion"] = version
        with pytest.raises(ApiError) as invalid:
            admin.create(path, bad)
        assert invalid.value.status == 422, path


def test_koordinators_nodeslo_crd_stores_every_field_the_agent_reads(admin: Api) -> None:
    """Koordinator's NodeSLO CRD (KOORDINATOR_VERSION) keeps every field of the agent's NodeSLO model that it
    knows; what it prunes is a field the real control plane can never send the agent."""
    name = unique("slo")
    spec = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressThresholdPercent": 65,
            "cpuSuppressPolicy": "cpuset",
            "memoryEvictThresholdPercent": 70,
            "cpuEvictBESatisfactionLowerPercent": 60,
            "cpuEvictBESatisfactionUpperPercent": 80,
            "cpuEvictTimeWindowSeconds": 300,
        },
        "cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 1000, "sharePoolThresholdPercent": 50},
        "systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150},
        "resourceQOSStrategy": {
            "lsClass": {
                "cpuQOS": {"enable": True, "groupIdentity": 2},
                "memoryQOS": {"enable": True, "minLimitPercent": 100, "throttlingPercent": 80},
                "resctrlQOS": {"enable": True, "catRangeStartPercent": 0, "catRangeEndPercent": 100},
            },
            "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
        },
    }
    stored = admin.create(NODESLO_PATH, nodeslo(name, spec))
    assert stored["spec"] == spec, KOORDINATOR_VERSION
