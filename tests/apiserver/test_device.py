"""The node's Device against the real kube-apiserver with Koordinator's Device CRD (config/crd/bases of the
Koordinator release, installed by the session fixture), written by the agent as a subprocess with the
chart's RBAC: created from koordlet's device-info files with an owner reference to the Node, accepted by the
CRD's schema without pruning, updated when a device's health changes, and none for a node without devices.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from koordqos.testing.nodefs import SyntheticNode

from .agentproc import running_agent
from .conftest import render_chart
from .controlplane import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, Api, ApiError, ControlPlane
from .kubeobjects import create_node, differences, eventually, try_get, unique

pytestmark = pytest.mark.e2e_apiserver
DEVICES_PATH = "/apis/scheduling.koordinator.sh/v1alpha1/devices"


@pytest.fixture(scope="module")
def device_rbac(control_plane: ControlPlane) -> None:
    """The chart's Device grant (rendered with the Accelerators gate on) bound to the agent's service account
    beside the session's default ClusterRole: the agent runs with exactly what the chart gives."""
    role = next(
        m
        for m in render_chart({"agent": {"featureGates": {"Accelerators": True}}})
        if m["kind"] == "ClusterRole"
    )
    rules = [r for r in role["rules"] if "devices" in r["resources"]]
    assert rules == [
        {
            "apiGroups": ["scheduling.koordinator.sh"],
            "resources": ["devices"],
            "verbs": ["get", "create", "update"],
        }
    ]
    api = control_plane.api()
    name = "koordqos-devices-e2e"
    objs = [
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": rules,
            },
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [
                    {"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": AGENT_NAMESPACE}
                ],
            },
        ),
    ]
    for path, body in objs:
        try:
            api.create(path, body)
        except ApiError as exc:
            if exc.status != 409:
                raise


def gpus(healthy_b: bool = True) -> list[dict[str, Any]]:
    return [
        {
            "vendor": "nvidia",
            "model": "A100-SXM4-80GB",
            "uuid": f"GPU-{i}",
            "minor": str(i),
            "resources": {"gpu-core": "100", "gpu-memory": "80Gi"},
            "topology": {"nodeID": str(i), "pcieID": f"pci0000:{i}a", "busID": f"0000:{i}b:00.0"},
            "status": {"healthy": healthy_b or i == 0, "errCode": "" if healthy_b or i == 0 else "Xid79"},
        }
        for i in (0, 1)
    ]


def agent_flags(infos: Path) -> tuple[str, ...]:
    return (
        "--feature-gates=Accelerators=true",
        f"--xpu-device-infos-dir={infos}",
        "--node-topology-sync-interval=0.5s",
    )


@pytest.mark.usefixtures("device_rbac")
def test_the_device_of_a_node_with_gpus(control_plane: ControlPlane, admin: Api, tmp_path: Path) -> None:
    node_name = unique("gpunode")
    node_obj = create_node(admin, node_name)
    infos = tmp_path / "xpu-device-infos"
    infos.mkdir()
    (infos / "gpus.json").write_text(json.dumps(gpus()))
    node = SyntheticNode(tmp_path / "node")
    path = f"{DEVICES_PATH}/{node_name}"
    with running_agent(control_plane, node, node_name, tmp_path, *agent_flags(infos)) as agent:
        eventually(lambda: try_get(admin, path) is not None, 60, "the agent's Device")
        stored = admin.get(path)
        assert stored["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node_obj["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert stored["metadata"]["labels"] == {
            "node.koordinator.sh/gpu-model": "A100-SXM4-80GB",
            "node.koordinator.sh/gpu-vendor": "nvidia",
        }
        # what the agent computed is what the server kept: nothing pruned by the CRD's schema
        sent = agent.state()["status"]["report"]["device"]["device"]
        assert differences(stored["spec"], sent["spec"]) == []
        first, second = stored["spec"]["devices"]
        assert (first["id"], first["minor"], first["type"], first["health"]) == ("GPU-0", 0, "gpu", True)
        assert first["resources"] == {
            "koordinator.sh/gpu-core": "100",
            "koordinator.sh/gpu-memory": "80Gi",
            "koordinator.sh/gpu-memory-ratio": "100",
        }
        assert first["topology"] == {
            "socketID": -1,
            "nodeID": 0,
            "pcieID": "pci0000:0a",
            "busID": "0000:0b:00.0",
        }
        assert [c["status"] for c in second["conditions"]] == ["True"]
        healthy_since = first["conditions"][0]["lastTransitionTime"]

        # GPU-1 fails: the Device follows; GPU-0's condition keeps its transition time
        (infos / "gpus.json").write_text(json.dumps(gpus(healthy_b=False)))

        def unhealthy() -> bool:
            devices = admin.get(path)["spec"]["devices"]
            return devices[1]["health"] is False

        eventually(unhealthy, 30, "GPU-1 reported unhealthy")
        first, second = admin.get(path)["spec"]["devices"]
        assert second["conditions"][0]["status"] == "False"
        assert second["conditions"][0]["reason"] == "Xid79"
        assert first["conditions"][0]["lastTransitionTime"] == healthy_since


@pytest.mark.usefixtures("device_rbac")
def test_a_node_without_devices_writes_no_device(
    control_plane: ControlPlane, admin: Api, tmp_path: Path
) -> None:
    node_name = unique("plainnode")
    create_node(admin, node_name)
    infos = tmp_path / "empty-infos"
    infos.mkdir()
    node = SyntheticNode(tmp_path / "node")
    with running_agent(control_plane, node, node_name, tmp_path, *agent_flags(infos)) as agent:

        def decided() -> bool:
            report = agent.state()["status"]["report"]
            return bool(report.get("device")) and report["device"]["outcome"] == "none"

        eventually(decided, 60, "the device reporter's round")
        assert try_get(admin, f"{DEVICES_PATH}/{node_name}") is None
