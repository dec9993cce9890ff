"""The agent in cluster mode against a real kube-apiserver, with only the chart's RBAC.

Watches with server-side field selectors and bookmarks from the real watch cache, eviction through the real
eviction subresource with a real PodDisruptionBudget, Events as the real server stores them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import SyntheticNode

from .agentproc import AgentProcess, running_agent
from .controlplane import Api, ApiError, ControlPlane
from .kubeobjects import (
    NODESLO_PATH,
    create_namespace,
    create_node,
    create_running_pod,
    eventually,
    evicted,
    nodeslo,
    pod_events,
    set_pdb,
    unique,
)

pytestmark = pytest.mark.e2e_apiserver
GiB = 1 << 30


def pods_in_state(agent: AgentProcess) -> dict[str, dict[str, Any]]:
    return {f"{p['namespace']}/{p['name']}": p for p in agent.state()["pods"]}


def cpu_suppress_threshold(agent: AgentProcess) -> int | None:
    slo = agent.state()["node_slo"] or {}
    be = slo.get("resource_used_threshold_with_be") or {}
    value = be.get("cpu_suppress_threshold_percent")
    return int(value) if value is not None else None


def test_pods_node_and_nodeslo_watches(control_plane: ControlPlane, admin: Api, tmp_path: Path) -> None:
    node_name, ns = unique("node"), unique("ns")
    other_node = unique("other")
    create_namespace(admin, ns)
    create_node(admin, node_name, cpu="8", memory="32Gi")
    create_node(admin, other_node)
    be = create_running_pod(admin, ns, "be", node_name, qos="BE")
    create_running_pod(admin, ns, "ls", node_name, requests={"cpu": "1"}, limits={"cpu": "2"})
    create_running_pod(admin, ns, "elsewhere", other_node, qos="BE")
    admin.create(
        NODESLO_PATH,
        nodeslo(
            node_name, {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 55}}
        ),
    )
    node = SyntheticNode(tmp_path / "node", cpus=8, memory_total=32 * GiB)
    node.add_pod(parse_pod(be))

    with running_agent(control_plane, node, node_name, tmp_path) as agent:
        # the list: only this node's pods (server-side field selector spec.nodeName), with their QoS
        pods = pods_in_state(agent)
        assert set(pods) == {f"{ns}/be", f"{ns}/ls"}
        assert pods[f"{ns}/be"]["qos"] == "BE"
        assert pods[f"{ns}/be"]["uid"] == be["metadata"]["uid"]  # the UID the server assigned
        assert pods[f"{ns}/ls"]["kube_qos"].lower() == "burstable"  # status.qosClass computed by the server
        state = agent.state()
        assert state["node"]["name"] == node_name
        assert cpu_suppress_threshold(agent) == 55

        # watch: a NodeSLO update (PUT with the stored resourceVersion) is applied
        stored = admin.get(f"{NODESLO_PATH}/{node_name}")
        stored["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] = 42
        admin.put(f"{NODESLO_PATH}/{node_name}", stored)
        eventually(lambda: cpu_suppress_threshold(agent) == 42, 20, "NodeSLO update applied")

        # watch: a pod added, then deleted
        create_running_pod(admin, ns, "late", node_name, qos="LS")
        eventually(lambda: f"{ns}/late" in pods_in_state(agent), 20, "new pod seen")
        admin.delete(f"/api/v1/namespaces/{ns}/pods/late")
        eventually(lambda: f"{ns}/late" not in pods_in_state(agent), 20, "deleted pod gone")
        create_running_pod(admin, ns, "late-elsewhere", other_node, qos="BE")

        # the NodeSLO deleted: the agent falls back to defaults (no BE threshold override)
        admin.delete(f"{NODESLO_PATH}/{node_name}")
        eventually(lambda: cpu_suppress_threshold(agent) != 42, 20, "NodeSLO deletion applied")
        assert f"{ns}/late-elsewhere" not in pods_in_state(agent)
        warnings = [r for r in agent.log_records() if r.get("level") in {"warning", "error"}]
        # the message and error only: a timestamp's digits may hold "403" (a flake seen in CI)
        said = [f"{w.get('event', '')} {w.get('error', '')}" for w in warnings]
        assert not [t for t in said if "forbidden" in t.lower() or "HTTP 403" in t], warnings


def test_eviction_honours_a_real_pod_disruption_budget(
    control_plane: ControlPlane, admin: Api, tmp_path: Path
) -> None:
    node_name, ns = unique("node"), unique("ns")
    create_namespace(admin, ns)
    create_node(admin, node_name, cpu="4", memory="100Gi")
    node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=100 * GiB)
    usage = {"be-a": 20 * GiB, "be-b": 5 * GiB, "be-c": 10 * GiB, "ls": 30 * GiB}
    specs: list[tuple[str, str, int, dict[str, str]]] = [
        ("be-a", "BE", 100, {"app": "guarded"}),
        ("be-b", "BE", 100, {}),
        ("be-c", "BE", 120, {}),
        ("ls", "LS", 9000, {}),
    ]
    for name, qos, prio, labels in specs:
        pod = create_running_pod(admin, ns, name, node_name, qos=qos, labels=labels, priority=prio)
        node.set_memory(node.add_pod(parse_pod(pod)), usage[name])
    # be-a (the largest, first in line) is protected by a PDB that allows no disruption now
    set_pdb(admin, ns, "guard", {"app": "guarded"}, allowed=0)
    node.set_meminfo(100 * GiB, 5 * GiB, 4 * GiB)  # 95 % used, threshold 70 %
    admin.create(
        NODESLO_PATH,
        nodeslo(
            node_name, {"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": 70}}
        ),
    )
    gates = "--feature-gates=BEMemoryEvict=true"
    with running_agent(
        control_plane, node, node_name, tmp_path, gates, "--memory-evict-cool-time-seconds=0.5"
    ) as agent:
        # the others go; be-a is refused with 429 and stays
        eventually(
            lambda: evicted(admin, ns, "be-b") and evicted(admin, ns, "be-c"), 30, "be-b, be-c evicted"
        )

        def failures() -> list[dict[str, Any]]:
            return [e for e in pod_events(admin, ns, "be-a") if e["reason"] == "evictPodFail"]

        eventually(lambda: bool(failures()), 30, "an evictPodFail Event for be-a")
        fail = failures()
        assert "disruption budget" in fail[0]["message"], fail[0]
        assert fail[0]["type"] == "Warning"
        assert fail[0]["source"]["component"] == "koordqos"
        assert not evicted(admin, ns, "be-a")
        assert not evicted(admin, ns, "ls")
        for pod in ("be-b", "be-c"):
            ok = [e for e in pod_events(admin, ns, pod) if e["reason"] == "evictPodSuccess"]
            assert ok, pod
            assert ok[0]["involvedObject"]["kind"] == "Pod"
            assert ok[0]["message"].startswith(f"evict Pod:{ns}/{pod}, reason: ")

        # the budget now allows one disruption: the agent's retry evicts be-a through the same subresource
        set_pdb(admin, ns, "guard", {"app": "guarded"}, allowed=1)
        eventually(lambda: evicted(admin, ns, "be-a"), 90, "be-a evicted once the PDB allows it")
        pdb = admin.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/guard")
        assert pdb["status"]["disruptionsAllowed"] == 0  # the eviction subresource spent the one allowed
        assert "be-a" in pdb["status"].get("disruptedPods", {})
        decisions = [d for d in agent.decisions() if d["action"] in {"evict", "evict-failed"}]
        assert {d["target"] for d in decisions if d["action"] == "evict"} == {
            f"{ns}/be-a",
            f"{ns}/be-b",
            f"{ns}/be-c",
        }
    assert not evicted(admin, ns, "ls")


def test_requests_outside_the_chart_role_are_forbidden(control_plane: ControlPlane) -> None:
    agent = control_plane.api(control_plane.agent_token)
    # inside the role
    assert agent.status_of("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dx&limit=1") == 200
    assert agent.status_of("GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dx") == 200
    assert agent.status_of("GET", f"{NODESLO_PATH}?fieldSelector=metadata.name%3Dx") == 200
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "nope", "namespace": "default"},
    }
    assert agent.status_of("POST", "/api/v1/namespaces/default/pods/nope/eviction", eviction) == 404
    # outside it
    forbidden = [
        ("GET", "/api/v1/secrets", None),
        ("GET", "/api/v1/namespaces/default/configmaps", None),
        ("DELETE", "/api/v1/namespaces/default/pods/nope", None),
        (
            "POST",
            "/api/v1/namespaces/default/pods",
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}},
        ),
        ("PUT", "/api/v1/nodes/x", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}}),
        ("PUT", "/api/v1/nodes/x/status", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}}),
        ("POST", NODESLO_PATH, nodeslo("x", {})),
        ("DELETE", f"{NODESLO_PATH}/x", None),
        ("GET", "/api/v1/namespaces/default/events", None),
    ]
    got = {(m, p): agent.status_of(m, p, b) for m, p, b in forbidden}
    assert got == {k: 403 for k in got}
    # the user with no binding at all cannot do what the chart grants: the grants come from the chart's role
    nobody = control_plane.api(control_plane.nobody_token)
    assert nobody.status_of("GET", "/api/v1/pods?limit=1") == 403
    with pytest.raises(ApiError) as denied:
        nobody.get(f"{NODESLO_PATH}?limit=1")
    assert denied.value.status == 403
