"""The real koordlet (Koordinator KOORDINATOR_VERSION) runs on a synthetic node against the suite's
kube-apiserver and reports the NodeMetric (issue #33 items 3 and 4: what bench/koordlet_side_by_side.py runs).

koordlet's pods come from a fake kubelet (its `/pods/`, plain HTTP: `--kubelet-insecure-tls`), its host
roots are the synthetic node's; tests/apiserver/koordlet.py has the flags and what is switched off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import GiB, SyntheticNode

from .controlplane import KOORDINATOR_VERSION, ControlPlane
from .koordlet import KOORDLET, FakeKubelet, create_kubelet_node, prepare_node, running_koordlet
from .kubeobjects import (
    NODEMETRIC_PATH,
    NODESLO_PATH,
    create_namespace,
    create_running_pod,
    eventually,
    nodemetric,
    nodeslo,
    unique,
)

pytestmark = [pytest.mark.e2e_apiserver, pytest.mark.e2e_koordinator]

MODE_ENV = "KOORDQOS_E2E_KOORDINATOR"  # "require" (nox -s e2e-koordinator): a missing build fails
MiB = 1 << 20


@pytest.fixture
def koordlet_binary() -> Path:
    if not KOORDLET.is_file():
        why = f"koordlet {KOORDINATOR_VERSION} not built: `python -m tests.apiserver.koordinator koordlet`"
        if os.environ.get(MODE_ENV) == "require":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return KOORDLET


def test_koordlet_reports_the_synthetic_nodes_pods_in_the_nodemetric(
    control_plane: ControlPlane, koordlet_binary: Path, tmp_path: Path
) -> None:
    api = control_plane.api()
    node_name, ns = unique("koordlet-node"), unique("ns")
    create_namespace(api, ns)
    kubelet = FakeKubelet().start()
    try:
        create_kubelet_node(api, node_name, kubelet.port, "4", "16Gi")
        api.create(NODESLO_PATH, nodeslo(node_name, {"resourceUsedThresholdWithBE": {"enable": True}}))
        api.create(NODEMETRIC_PATH, nodemetric(node_name, report_interval=5))
        node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=16 * GiB)
        prepare_node(node, 16 * GiB)
        web = create_running_pod(api, ns, "web", node_name, qos="LS", requests={"cpu": "1", "memory": "1Gi"})
        batch = create_running_pod(api, ns, "batch", node_name, qos="BE")
        used = {"web": 300 * MiB, "batch": 100 * MiB}
        for pod in (web, batch):
            mem = used[pod["metadata"]["name"]]
            node.set_memory(node.add_pod(parse_pod(pod)), mem, anon=mem)
        kubelet.set_pods([web, batch])
        seen: list[Any] = []

        def reported() -> bool:
            status = api.get(f"{NODEMETRIC_PATH}/{node_name}").get("status") or {}
            seen[:] = [status]
            names = {p["name"] for p in status.get("podsMetric") or []}
            return names == {"web", "batch"}

        with running_koordlet(control_plane, node, node_name, kubelet, tmp_path / "koordlet") as koordlet:
            eventually(reported, 90, lambda: f"koordlet's NodeMetric status: {seen} {koordlet.log_tail(10)}")
            assert koordlet.proc.poll() is None, koordlet.log_tail()
        status = seen[0]
        assert kubelet.requests > 0
        by_name = {p["name"]: p for p in status["podsMetric"]}
        # the memory koordlet counts is the pods' memory less their page cache: the anonymous pages set above
        assert by_name["web"]["podUsage"]["resources"]["memory"] == "300Mi", by_name
        assert by_name["batch"]["podUsage"]["resources"]["memory"] == "100Mi", by_name
        assert by_name["web"]["qos"] == "LS"
        assert by_name["batch"]["qos"] == "BE"
        assert status["nodeMetric"]["nodeUsage"]["resources"]["memory"]
    finally:
        kubelet.stop()
