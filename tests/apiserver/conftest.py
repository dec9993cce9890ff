"""Fixtures for the real-API-server suite: one control plane per session, the chart's RBAC and Koordinator's
own CRDs (config/crd/bases of the Koordinator release, KOORDINATOR_VERSION); the chart's NodeSLO CRD is
installed too, under a test group of its own (CHART_NODESLO_GROUP), so its schema is checked beside the real
one.

The suite runs when KOORDQOS_E2E_APISERVER is set (`nox -s e2e-apiserver` sets it): `1` builds what is
missing and skips with the reason if the binaries cannot be built or started here; `require` fails instead
(CI). Unset, every test is skipped with a printed reason, so the README's test command needs no Go.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .controlplane import (
    AGENT_NAMESPACE,
    AGENT_SERVICE_ACCOUNT,
    AGENT_USER,
    ApiError,
    ControlPlane,
    Unavailable,
    build_binaries,
    koordinator_crds,
    running_control_plane,
)
from .kubeobjects import eventually

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "koordqos"
CHART_NODESLO_GROUP = "chart-test.koordqos.io"  # the chart's NodeSLO CRD, renamed to sit beside the real one
#: Koordinator's NodeMetric CRD with the two status fields of koordinator#3138 (the commit the reporting
#: follows, which the Go module proxy here does not serve), under a test group of its own beside the real
#: v1.8.0 one
NODEMETRIC_3138_GROUP = "koordinator-3138.koordqos.io"


def with_3138_fields(crd: dict[str, Any]) -> dict[str, Any]:
    """v1.8.0's NodeMetric CRD plus `status.nodeMetric.numaUsages` and `status.prodPeakMetric` as #3138's Go
    types define them (docs/reporting.md, "Status fields"; docs/prediction.md, "numaUsages"):
    `NUMAUsage{numaNodeID int32 (required), nodeUsage, systemUsage ResourceMap}` and `prodPeakMetric{resource
    ResourceMap}` — the schemas of the ResourceMaps copied from the CRD's own `nodeUsage` /
    `prodReclaimableMetric`, as controller-gen emits them for the same Go type."""
    out = copy.deepcopy(crd)
    (version,) = out["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    node_metric = status["nodeMetric"]["properties"]
    resource_map = node_metric["nodeUsage"]
    assert "numaUsages" not in node_metric, "the CRD has it already"
    assert "prodPeakMetric" not in status, "the CRD has it already"
    node_metric["numaUsages"] = {
        "description": "NUMAUsages is the resource usage of each NUMA node",
        "items": {
            "properties": {
                "numaNodeID": {"format": "int32", "type": "integer"},
                "nodeUsage": copy.deepcopy(resource_map),
                "systemUsage": copy.deepcopy(resource_map),
            },
            "required": ["numaNodeID"],
            "type": "object",
        },
        "type": "array",
    }
    status["prodPeakMetric"] = copy.deepcopy(status["prodReclaimableMetric"])
    status["prodPeakMetric"]["description"] = "ProdPeakMetric is the predicted peak of Prod type resources"
    return out


def regrouped(crd: dict[str, Any], group: str) -> dict[str, Any]:
    """A CRD under another API group (its schema unchanged)."""
    out = {**crd, "metadata": {**crd["metadata"], "name": f"{crd['spec']['names']['plural']}.{group}"}}
    out["spec"] = {**crd["spec"], "group": group}
    return out


MODE_ENV = "KOORDQOS_E2E_APISERVER"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mode = os.environ.get(MODE_ENV, "")
    if mode in {"1", "require"}:
        return
    skip = pytest.mark.skip(
        reason=f"real kube-apiserver suite: `nox -s e2e-apiserver` builds and runs it ({MODE_ENV}=1)"
    )
    for item in items:
        if "e2e_apiserver" in item.keywords:
            item.add_marker(skip)


def render_chart(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every manifest of the chart, rendered by the Helm engine with the tests' release name and namespace."""
    import helm_python as helm

    with helm.Chart.load(CHART_DIR) as chart:
        out = chart.render(values, name="koordqos", namespace=AGENT_NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path in sorted(out):
        if not path.endswith("NOTES.txt"):
            docs.extend(d for d in yaml.safe_load_all(out[path]) if d)
    return docs


def install_crd(cp: ControlPlane, crd: dict[str, Any]) -> None:
    """Create a CRD and wait until it is Established (its resource is served)."""
    api = cp.api()
    api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    name = crd["metadata"]["name"]

    def established() -> bool:
        doc = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = (doc.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    eventually(established, 30, f"CRD {name} established")


def apply_rbac(cp: ControlPlane, manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """Create the chart's ServiceAccount, ClusterRole and ClusterRoleBinding; the ClusterRole is returned."""
    api = cp.api()
    by_kind = {
        m["kind"]: m
        for m in manifests
        if m["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    }
    sa = by_kind["ServiceAccount"]
    assert (sa["metadata"]["namespace"], sa["metadata"]["name"]) == (AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT)
    binding = by_kind["ClusterRoleBinding"]
    # the token the agent runs with authenticates as exactly the subject the chart binds
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": AGENT_NAMESPACE}
    ], AGENT_USER
    api.create(f"/api/v1/namespaces/{AGENT_NAMESPACE}/serviceaccounts", sa)
    role = api.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", by_kind["ClusterRole"])
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    return dict(role)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver for the whole session, with the chart's RBAC and Koordinator's CRDs."""
    require = os.environ.get(MODE_ENV) == "require"
    problem = ""
    try:
        binaries = build_binaries(tmp_path_factory.mktemp("go-build"))
        crds = koordinator_crds()
        cm = running_control_plane(binaries)
        cp = cm.__enter__()
    except Unavailable as exc:
        problem = f"real kube-apiserver unavailable: {exc}"
    if problem:
        if require:
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    try:
        cp.api().create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}},
        )
        manifests = render_chart()
        cp.chart_role = apply_rbac(cp, manifests)
        for crd in crds:
            install_crd(cp, crd)
            if crd["spec"]["names"]["kind"] == "NodeMetric":
                install_crd(cp, regrouped(with_3138_fields(crd), NODEMETRIC_3138_GROUP))
        for crd in [m for m in manifests if m["kind"] == "CustomResourceDefinition"]:
            install_crd(cp, regrouped(crd, CHART_NODESLO_GROUP))
        yield cp
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture
def admin(control_plane: ControlPlane) -> Any:
    """The admin client."""
    return control_plane.api()


__all__ = ["ApiError"]
