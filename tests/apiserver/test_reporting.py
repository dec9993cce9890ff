"""The agent's reports after a round trip through a real API server with Koordinator's structural CRDs.

The agent talks to the server through a recording proxy, so the test sees the exact bodies it wrote and the
server's `Warning` headers (the server warns for every unknown field it prunes). Checked: no write was
warned about, the stored NodeMetric status and NRT equal what the agent sent, and a main-resource PUT of the
NodeMetric (as koord-manager does to its spec) leaves the agent's status untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import SyntheticNode

from .agentproc import running_agent
from .conftest import NODEMETRIC_3138_GROUP
from .controlplane import Api, ControlPlane
from .kubeobjects import (
    NODEMETRIC_PATH,
    NRT_PATH,
    create_namespace,
    create_node,
    create_running_pod,
    differences,
    eventually,
    nodemetric,
    unique,
)
from .recorder import RecordingProxy

pytestmark = pytest.mark.e2e_apiserver
GiB = 1 << 30


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[RecordingProxy]:
    rec = RecordingProxy(control_plane.url, control_plane.ssl_context())
    rec.start()
    yield rec
    rec.stop()


#: what Koordinator v1.8.0's NodeMetric CRD does not have (newer: koordinator#3138) and prunes
NEWER_THAN_V1_8_0 = ["pruned .nodeMetric.numaUsages", "pruned .prodPeakMetric"]


def test_reports_survive_the_round_trip(
    control_plane: ControlPlane, admin: Api, proxy: RecordingProxy, tmp_path: Path
) -> None:
    node_name, ns = unique("node"), unique("ns")
    create_namespace(admin, ns)
    create_node(admin, node_name, cpu="4", memory="16Gi")
    node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=16 * GiB)
    node.set_numa(0, [0, 1], {"MemTotal": 8 * GiB, "MemFree": 6 * GiB})
    node.set_numa(1, [2, 3], {"MemTotal": 8 * GiB, "MemFree": 7 * GiB})
    for name, qos in (("web", "LS"), ("batch", "BE")):
        pod = create_running_pod(admin, ns, name, node_name, qos=qos)
        node.set_memory(node.add_pod(parse_pod(pod)), 1 * GiB)
    admin.create(NODEMETRIC_PATH, nodemetric(node_name, report_interval=30))
    status_path = f"{NODEMETRIC_PATH}/{node_name}/status"
    nrt_path = f"{NRT_PATH}/{node_name}"
    (tmp_path / "checkpoints").mkdir()
    checkpoints = f"--prediction-checkpoint-filepath={tmp_path / 'checkpoints'}"

    def predicted() -> bool:
        return any("prodPeakMetric" in w.body["status"] for w in proxy.writes_to(status_path))

    with running_agent(control_plane, node, node_name, tmp_path, checkpoints, server=proxy.url):
        eventually(predicted, 120, "the agent's NodeMetric status write with its prediction")
        eventually(lambda: proxy.writes_to(NRT_PATH), 30, "the agent's NRT write")

        # the status as the agent sent it is the status stored, but for what v1.8.0's CRD does not know
        # (pruned with a warning naming them); the Mid tier's input, prodReclaimableMetric, is stored
        write = [w for w in proxy.writes_to(status_path) if "prodPeakMetric" in w.body["status"]][-1]
        assert write.method == "PUT"
        assert write.status == 200, write.response
        sent = write.body["status"]
        assert sent["nodeMetric"]["nodeUsage"]["resources"].keys() >= {"cpu", "memory"}
        assert [n["numaNodeID"] for n in sent["nodeMetric"]["numaUsages"]] == [0, 1]
        assert sent["prodReclaimableMetric"]["resource"]["resources"].keys() == {"cpu", "memory"}
        assert write.warnings, "v1.8.0 prunes the newer fields with a warning"
        assert [w for w in write.warnings if "numaUsages" not in w and "prodPeakMetric" not in w] == []
        stored = admin.get(f"{NODEMETRIC_PATH}/{node_name}")
        assert sorted(differences(stored["status"], sent)) == NEWER_THAN_V1_8_0
        assert stored["status"]["prodReclaimableMetric"] == sent["prodReclaimableMetric"]
        pods = {(p["namespace"], p["name"]) for p in stored["status"].get("podsMetric", [])}
        assert {(ns, "web"), (ns, "batch")} <= pods

        # with #3138's fields in the CRD, the same status is stored whole and unwarned
        path_3138 = f"/apis/{NODEMETRIC_3138_GROUP}/v1alpha1/nodemetrics"
        body = nodemetric(node_name, report_interval=30)
        body["apiVersion"] = f"{NODEMETRIC_3138_GROUP}/v1alpha1"
        obj = admin.create(path_3138, body)
        obj["status"] = sent
        via_proxy = Api(proxy.url, control_plane.admin_token, control_plane.ssl_context())
        via_proxy.put(f"{path_3138}/{node_name}/status", obj)
        (full,) = proxy.writes_to(f"{path_3138}/{node_name}/status")
        assert full.warnings == [], full.warnings
        assert differences(admin.get(f"{path_3138}/{node_name}")["status"], sent) == []
        kept = stored["status"]  # what v1.8.0 keeps of it

        # koord-manager rewrites the spec with a PUT of the main resource: the status stays the agent's
        changed = copy.deepcopy(stored)
        changed["spec"]["metricCollectPolicy"]["aggregateDurationSeconds"] = 120
        changed["status"] = {"updateTime": "2000-01-01T00:00:00Z"}
        after = admin.put(f"{NODEMETRIC_PATH}/{node_name}", changed)
        assert after["spec"]["metricCollectPolicy"]["aggregateDurationSeconds"] == 120
        assert after["status"] == kept

        # the NRT: every write unwarned and answered 2xx; the stored object carries what was last sent
        nrt_writes = proxy.writes_to(NRT_PATH)
        assert all(w.warnings == [] for w in nrt_writes), [w.warnings for w in nrt_writes]
        assert all(200 <= w.status < 300 for w in nrt_writes), [(w.status, w.response) for w in nrt_writes]
        last = nrt_writes[-1].body
        nrt = admin.get(nrt_path)
        assert nrt["zones"] == last["zones"]
        assert nrt["topologyPolicies"] == last["topologyPolicies"]
        managed = {k: v for k, v in last["metadata"]["annotations"].items() if "koordinator.sh/" in k}
        assert managed
        assert {k: nrt["metadata"]["annotations"][k] for k in managed} == managed
        assert [z["type"] for z in nrt["zones"]] == ["Node"] * len(nrt["zones"])


def test_the_proxy_sees_the_servers_pruning_warnings(
    control_plane: ControlPlane, admin: Api, proxy: RecordingProxy
) -> None:
    """The no-warning checks above can fail: a status with a misspelled field draws a warning through it."""
    name = unique("nm")
    obj = admin.create(NODEMETRIC_PATH, nodemetric(name))
    obj["status"] = {"updateTime": "2026-12-01T18:30:00Z", "nodeMetrik": {}}
    via_proxy = Api(proxy.url, control_plane.admin_token, control_plane.ssl_context())
    via_proxy.put(f"{NODEMETRIC_PATH}/{name}/status", obj)
    (write,) = proxy.writes_to(f"{NODEMETRIC_PATH}/{name}/status")
    assert any("nodeMetrik" in w for w in write.warnings), write.warnings
    assert "nodeMetrik" not in admin.get(f"{NODEMETRIC_PATH}/{name}")["status"]
