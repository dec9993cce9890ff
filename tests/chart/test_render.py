"""The chart renders and lints with the real Helm engine; every manifest validates offline."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

from .chart_render import (
    CHART_DIR,
    KUBE_MIN_VERSION,
    KUBE_VERSION,
    NAMESPACE,
    NON_DEFAULT_VALUES,
    RELEASE,
    Rendered,
    render,
)
from .operator_schemas import PROMETHEUSRULE_SCHEMA

# kubernetes-validate ships only built-in kinds. The ServiceMonitor (monitoring.coreos.com/v1, a Prometheus
# Operator CRD) is checked against this pinned subset of its CRD schema instead: exactly the fields the chart
# may emit, nothing else allowed.
_DURATION = {"type": "string", "pattern": "^(0|([0-9]+(\\.[0-9]+)?(ms|s|m|h))+)$"}
SERVICEMONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                        "targetLabel": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _validate(manifest: dict[str, Any], version: str) -> None:
    operator_schemas = {"ServiceMonitor": SERVICEMONITOR_SCHEMA, "PrometheusRule": PROMETHEUSRULE_SCHEMA}
    if manifest["kind"] in operator_schemas:
        with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
            kubernetes_validate.validate(manifest, version, strict=True)
        jsonschema.Draft202012Validator(operator_schemas[manifest["kind"]]).validate(manifest)
        return
    kubernetes_validate.validate(manifest, version, strict=True)


def test_default_render_has_the_expected_objects(default_render: Rendered) -> None:
    kinds = sorted(m["kind"] for m in default_render.manifests)
    assert kinds == sorted(
        ["CustomResourceDefinition", "DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    )


def test_non_default_render_has_the_expected_objects(custom_render: Rendered) -> None:
    kinds = sorted(m["kind"] for m in custom_render.manifests)
    # crds.install=false and serviceAccount.create=false drop those; metrics add Service + ServiceMonitor,
    # the dashboard ConfigMap and the PrometheusRule.
    assert kinds == sorted(
        [
            "DaemonSet",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "ServiceMonitor",
            "ConfigMap",
            "PrometheusRule",
        ]
    )


@pytest.mark.parametrize("version", [KUBE_VERSION, KUBE_MIN_VERSION])
def test_default_manifests_validate_against_kubernetes_schemas(
    default_render: Rendered, version: str
) -> None:
    for manifest in default_render.manifests:
        _validate(manifest, version)


def test_non_default_manifests_validate_against_kubernetes_schemas(custom_render: Rendered) -> None:
    # appArmorProfile needs Kubernetes >= 1.30, so this set is checked at the pinned version only.
    for manifest in custom_render.manifests:
        _validate(manifest, KUBE_VERSION)


def test_validation_catches_a_broken_manifest(default_render: Rendered) -> None:
    """The validator in use really rejects a malformed DaemonSet (guards against a vacuous check)."""
    broken = dict(default_render.daemonset)
    broken["spec"] = {**broken["spec"], "minReadySeconds": "ten"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


def test_crd_is_a_valid_apiextensions_v1_crd(default_render: Rendered) -> None:
    crd = default_render.one("CustomResourceDefinition")
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "nodeslos.slo.koordinator.sh"
    assert spec["group"] == "slo.koordinator.sh"
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == "NodeSLO"
    assert spec["names"]["plural"] == "nodeslos"
    [version] = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"] == {"status": {}}
    # Uninstalling keeps the CRD, so NodeSLO objects survive.
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def _nodeslo_validator(rendered: Rendered) -> jsonschema.Validator:
    crd = rendered.one("CustomResourceDefinition")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator: jsonschema.Validator = jsonschema.Draft202012Validator(schema)
    return validator


def test_crd_schema_accepts_a_koordinator_nodeslo(default_render: Rendered) -> None:
    validator = _nodeslo_validator(default_render)
    nodeslo = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": "node-1"},
        "spec": {
            "resourceUsedThresholdWithBE": {
                "enable": True,
                "cpuSuppressThresholdPercent": 65,
                "cpuSuppressPolicy": "cpuset",
                "memoryEvictThresholdPercent": 70,
                "someNewerField": {"kept": True},
            },
            "resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}},
            "cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 1000},
            "systemStrategy": {"minFreeKbytesFactor": 100},
            "hostApplications": [{"name": "nginx", "qos": "LS"}],
        },
        "status": {},
    }
    validator.validate(nodeslo)


def test_crd_schema_rejects_wrong_types(default_render: Rendered) -> None:
    validator = _nodeslo_validator(default_render)
    bad = {"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": "65"}}}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"spec": {"cpuBurstStrategy": {"policy": 3}}})


def test_crd_can_be_skipped_and_kept_or_not(chart: helm.Chart) -> None:
    assert render(chart, {"crds": {"install": False}}).of_kind("CustomResourceDefinition") == []
    crd = render(chart, {"crds": {"keep": False}}).one("CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_lint_is_clean(values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    # Severity 1 is info ("icon is recommended"); warnings (2) and errors (3) are not allowed.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_bad_values() -> None:
    report = helm.lint(CHART_DIR, {"agent": {"logFormat": "xml"}}, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"], report
    assert any("logFormat" in e for e in report["errors"])


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"agent": {"nri": {"pluginIndex": "100"}}}, "pluginIndex"),
        ({"agent": {"nri": {"pluginIndex": 100}}}, "pluginIndex"),
        ({"agent": {"featureGates": {"CPUBurst": "off"}}}, "CPUBurst"),
        ({"agent": {"dryRun": "yes"}}, "dryRun"),
        ({"agent": {"extraArgs": ["dry-run"]}}, "extraArgs"),
        ({"agnet": {}}, "agnet"),
        ({"hostPaths": {"cgroupRoot": "sys/fs/cgroup"}}, "cgroupRoot"),
    ],
)
def test_values_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=field):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_release_name_shapes_object_names(chart: helm.Chart) -> None:
    out = chart.render(None, name="edge", namespace="qos")
    assert "name: edge-koordqos" in out["koordqos/templates/daemonset.yaml"]
    assert "namespace: qos" in out["koordqos/templates/daemonset.yaml"]
