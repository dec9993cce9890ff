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
from .controlplane import Api, ControlPlane
from .kubeobjects import (
    NODEMETRIC_PATH,
    NRT_PATH,
    create_namespace,
    create_node,
    create_running_pod,
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


def test_reports_survive_the_round_trip(
    control_plane: ControlPlane, admin: Api, proxy: RecordingProxy, tmp_path: Path
) -> None:
    node_name, ns = unique("node"), unique("ns")
    create_namespace(admin, ns)
    create_node(admin, node_name, cpu="4", memory="16Gi")
    node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=16 * GiB)
    for name, qos in (("web", "LS"), ("batch", "BE")):
        pod = create_running_pod(admin, ns, name, node_name, qos=qos)
        node.set_memory(node.add_pod(parse_pod(pod)), 1 * GiB)
    admin.create(NODEMETRIC_PATH, nodemetric(node_name, report_interval=30))
    status_path = f"{NODEMETRIC_PATH}/{node_name}/status"
    nrt_path = f"{NRT_PATH}/{node_name}"

    with running_agent(control_plane, node, node_name, tmp_path, server=proxy.url):
        eventually(lambda: proxy.writes_to(status_path), 90, "the agent's NodeMetric status write")
        eventually(lambda: proxy.writes_to(NRT_PATH), 30, "the agent's NRT write")

        # the status as the agent sent it is the status stored: nothing pruned, nothing warned
        write = proxy.writes_to(status_path)[-1]
        assert write.method == "PUT"
        assert write.status == 200, write.response
        assert write.warnings == [], write.warnings
        sent = write.body["status"]
        assert sent["nodeMetric"]["nodeUsage"]["resources"].keys() >= {"cpu", "memory"}
        stored = admin.get(f"{NODEMETRIC_PATH}/{node_name}")
        assert stored["status"] == sent
        pods = {(p["namespace"], p["name"]) for p in stored["status"].get("podsMetric", [])}
        assert {(ns, "web"), (ns, "batch")} <= pods

        # koord-manager rewrites the spec with a PUT of the main resource: the status stays the agent's
        changed = copy.deepcopy(stored)
        changed["spec"]["metricCollectPolicy"]["aggregateDurationSeconds"] = 120
        changed["status"] = {"updateTime": "2000-01-01T00:00:00Z"}
        after = admin.put(f"{NODEMETRIC_PATH}/{node_name}", changed)
        assert after["spec"]["metricCollectPolicy"]["aggregateDurationSeconds"] == 120
        assert after["status"] == sent

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
