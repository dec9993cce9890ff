"""The PSI interference rules' node condition and PreferNoSchedule taint against a real kube-apiserver, with
exactly the grants the chart adds for the PSIInterference gate (docs/psi.md): the kubelet's condition and
others' taints kept, ours added and removed, the resourceVersion precondition honoured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from koordqos.kube import KubeConnection
from koordqos.kube.client import ApiError
from koordqos.kube.nodemark import NodeMarker

from .conftest import render_chart
from .controlplane import ControlPlane
from .kubeobjects import create_node, eventually, unique

pytestmark = pytest.mark.e2e_apiserver
KEY = "koordqos.io/interference"
COND = "KoordQoSInterference"


def _role_rules(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    [role] = [m for m in render_chart(values) if m["kind"] == "ClusterRole"]
    return list(role["rules"])


def _psi_rules() -> list[dict[str, Any]]:
    """The rules the chart adds when the gate is on (those of the gated render not in the default one)."""
    default = _role_rules(None)
    gated = _role_rules({"agent": {"featureGates": {"PSIInterference": True}}})
    extra = [r for r in gated if r not in default]
    assert extra, "the chart adds no grant for the PSI rules"
    return extra


async def test_mark_and_unmark_with_the_charts_psi_grants(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    admin = control_plane.api()
    name = unique("psi-node")
    node = create_node(admin, name)
    node["spec"] = {"taints": [{"key": "example.com/dedicated", "value": "db", "effect": "NoSchedule"}]}
    admin.put(f"/api/v1/nodes/{name}", node)
    role, binding = unique("koordqos-psi"), unique("koordqos-psi")
    admin.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": _psi_rules(),
        },
    )
    admin.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "nobody"}],
        },
    )
    nobody = control_plane.api(control_plane.nobody_token)
    eventually(lambda: nobody.status_of("GET", f"/api/v1/nodes/{name}") == 200, 30, "the PSI grants in force")
    conn = KubeConnection(str(control_plane.write_kubeconfig(tmp_path / "kc", control_plane.nobody_token)))
    try:
        marker = NodeMarker(conn.get, name)
        assert await marker.mark(COND, KEY, "PSIInterference", "cpu: pod stall 0.30")
        got = admin.get(f"/api/v1/nodes/{name}")
        taints = {t["key"]: t["effect"] for t in got["spec"]["taints"]}
        assert taints == {"example.com/dedicated": "NoSchedule", KEY: "PreferNoSchedule"}
        conds = {c["type"]: c for c in got["status"]["conditions"]}
        assert conds["Ready"]["status"] == "True"  # the kubelet's own, kept
        assert (conds[COND]["status"], conds[COND]["reason"]) == ("True", "PSIInterference")
        assert await marker.unmark(COND, KEY, "PSIInterferenceCleared", "clean")
        got = admin.get(f"/api/v1/nodes/{name}")
        assert [t["key"] for t in got["spec"]["taints"]] == ["example.com/dedicated"]
        conds = {c["type"]: c for c in got["status"]["conditions"]}
        assert conds[COND]["status"] == "False"
        assert conds["Ready"]["status"] == "True"
        # the precondition is the real server's: a stale resourceVersion is a 409, which the marker answers by
        # reading again (proven here by a merge patch of its own shape sent with a stale version)
        client = await conn.get()
        stale = {"metadata": {"resourceVersion": "1"}, "spec": {"taints": []}}
        with pytest.raises(ApiError) as conflict:
            await client.request(
                "PATCH", f"/api/v1/nodes/{name}", body=stale, content_type="application/merge-patch+json"
            )
        assert conflict.value.status == 409
    finally:
        await conn.close()
        admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")
        admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")
        admin.delete(f"/api/v1/nodes/{name}")
