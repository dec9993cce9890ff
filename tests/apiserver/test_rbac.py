"""The chart's ClusterRole is exactly what the agent uses: nothing it needs is missing, nothing is spare.

The agent runs with a token that authenticates as the chart's service account, bound to the ClusterRole
rendered from charts/ and nothing else. It goes through every API path it has (list/watch of pods, Node and
NodeSLO, an eviction that succeeds and one a PodDisruptionBudget refuses, Events, the NodeMetric status
report, the NodeResourceTopology's create and update, the kubelet /configz through the node proxy). The API
server's audit log then tells which (group, resource, verb) the agent used and what was answered:
* any 403 → a permission is missing from the chart;
* a grant the agent never used → an excess permission in the chart.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import SyntheticNode

from .agentproc import running_agent
from .controlplane import Api, ControlPlane
from .kubeobjects import (
    NODEMETRIC_PATH,
    NODESLO_PATH,
    NRT_PATH,
    annotate_node,
    create_namespace,
    create_node,
    create_running_pod,
    eventually,
    evicted,
    nodemetric,
    nodeslo,
    pod_events,
    set_pdb,
    try_get,
    unique,
)

pytestmark = pytest.mark.e2e_apiserver
GiB = 1 << 30

Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def role_grants(role: dict[str, Any]) -> set[Grant]:
    """Every (group, resource, verb) a ClusterRole grants."""
    out: set[Grant] = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule, rule
        assert "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def used_grants(entries: list[dict[str, Any]]) -> dict[Grant, set[int]]:
    """(group, resource, verb) → the HTTP codes answered, from audit entries of resource requests."""
    out: dict[Grant, set[int]] = {}
    for e in entries:
        ref = e.get("objectRef")
        if not ref:
            continue  # discovery and other non-resource URLs: granted to every authenticated user
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        code = int(e.get("responseStatus", {}).get("code", 0))
        out.setdefault((ref.get("apiGroup", ""), resource, e["verb"]), set()).add(code)
    return out


def _since(entries: list[dict[str, Any]], start: str) -> list[dict[str, Any]]:
    """The agent process's requests (its User-Agent; the suite's own probes with the same token are not
    the agent) received at or after `start`."""
    return [
        e
        for e in entries
        if str(e.get("requestReceivedTimestamp", "")) >= start
        and str(e.get("userAgent", "")).startswith("koordqos")
    ]


def test_the_agent_uses_exactly_the_chart_cluster_role(
    control_plane: ControlPlane, admin: Api, tmp_path: Path
) -> None:
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    node_name, ns = unique("node"), unique("ns")
    create_namespace(admin, ns)
    create_node(admin, node_name, cpu="4", memory="100Gi")
    node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=100 * GiB)
    for name, usage, labels in (("be-a", 30 * GiB, {"app": "guarded"}), ("be-b", 10 * GiB, {})):
        pod = create_running_pod(admin, ns, name, node_name, qos="BE", labels=labels, priority=100)
        node.set_memory(node.add_pod(parse_pod(pod)), usage)
    set_pdb(admin, ns, "guard", {"app": "guarded"}, allowed=0)
    node.set_meminfo(100 * GiB, 5 * GiB, 4 * GiB)
    spec = {"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": 70}}
    admin.create(NODESLO_PATH, nodeslo(node_name, spec))
    # koord-manager's NodeMetric for the node, at the shortest report interval the agent honours
    admin.create(NODEMETRIC_PATH, nodemetric(node_name, report_interval=30))
    # a missing grant makes the scenario itself fail (the agent never becomes ready, or an eviction never
    # happens); the audit log then names the grant, so that is reported first
    scenario_failure: AssertionError | None = None
    try:
        with running_agent(control_plane, node, node_name, tmp_path, "--feature-gates=BEMemoryEvict=true"):
            eventually(lambda: evicted(admin, ns, "be-b"), 30, "be-b evicted")
            eventually(
                lambda: any(e["reason"] == "evictPodFail" for e in pod_events(admin, ns, "be-a")),
                30,
                "be-a's eviction refused by the PDB",
            )
            # a watch event after the list: the watch requests are in the log too
            stored = admin.get(f"{NODESLO_PATH}/{node_name}")
            stored["spec"]["resourceUsedThresholdWithBE"]["memoryEvictThresholdPercent"] = 80
            admin.put(f"{NODESLO_PATH}/{node_name}", stored)
            # a Node annotation the NRT copies: the agent updates the NRT it created
            eventually(lambda: try_get(admin, f"{NRT_PATH}/{node_name}") is not None, 30, "NRT created")
            annotate_node(admin, node_name, {"node.koordinator.sh/reservation": '{"reservedCPUs":"0"}'})

            def seen() -> set[tuple[str, str]]:
                return {
                    (e["objectRef"]["resource"] + "/" + e["objectRef"].get("subresource", ""), e["verb"])
                    for e in _since(control_plane.agent_requests(), start)
                    if e.get("objectRef")
                }

            for resource, verb in (
                ("nodeslos/", "watch"),
                ("noderesourcetopologies/", "update"),
                ("nodemetrics/status", "update"),
            ):
                eventually(
                    lambda r=resource, v=verb: (r, v) in seen(), 90, f"the agent's {verb} of {resource}"
                )
    except AssertionError as exc:
        scenario_failure = exc
    used = used_grants(_since(control_plane.agent_requests(), start))
    denied = {g: codes for g, codes in used.items() if 403 in codes}
    assert not denied, f"the chart's ClusterRole lacks: {sorted(denied)} (the scenario: {scenario_failure})"
    if scenario_failure is not None:
        raise scenario_failure
    granted = role_grants(control_plane.chart_role)
    assert set(used) <= granted, f"used but not granted: {sorted(set(used) - granted)}"
    assert granted - set(used) == set(), f"granted but never used (excess): {sorted(granted - set(used))}"
    # the eviction went through the subresource, answered 201 once and 429 (the PDB) at least once
    assert {201, 429} <= used[("", "pods/eviction", "create")]
