"""Security-relevant fields of the rendered chart: privileges, RBAC, host mounts, probes, scheduling."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest

from .chart_render import NAMESPACE, Rendered, render

# Exactly the access the agent needs in cluster mode (docs/deployment.md, "RBAC").
# tests/apiserver/test_rbac.py checks it against what the agent really does on a real API server.
MINIMAL_RBAC = {
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/eviction", "create"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("slo.koordinator.sh", "nodeslos", "list"),
    ("slo.koordinator.sh", "nodeslos", "watch"),
    ("", "events", "create"),
}
# the reports (defaults: NodeMetric status, NRT, kubelet /configz; docs/deployment.md, "RBAC")
REPORT_RBAC = {
    ("slo.koordinator.sh", "nodemetrics", "get"),
    ("slo.koordinator.sh", "nodemetrics/status", "update"),
    ("topology.node.k8s.io", "noderesourcetopologies", "get"),
    ("topology.node.k8s.io", "noderesourcetopologies", "create"),
    ("topology.node.k8s.io", "noderesourcetopologies", "update"),
    ("", "nodes/proxy", "get"),
}


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair anywhere in a manifest."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _privileged_anywhere(rendered: Rendered) -> bool:
    return any(key == "privileged" and value is True for m in rendered.manifests for key, value in _walk(m))


def rbac_grants(rendered: Rendered) -> set[tuple[str, str, str]]:
    grants = set()
    for rule in rendered.one("ClusterRole")["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames/nonResourceURLs expected"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    grants.add((group, resource, verb))
    return grants


def test_not_privileged_unless_asked(any_render: Rendered) -> None:
    assert not _privileged_anywhere(any_render)
    assert any_render.container["securityContext"]["privileged"] is False


def test_privileged_only_when_the_value_asks(chart: helm.Chart) -> None:
    rendered = render(chart, {"securityContext": {"privileged": True}})
    assert _privileged_anywhere(rendered)
    sc = rendered.container["securityContext"]
    assert sc["privileged"] is True
    # Kubernetes rejects privileged together with allowPrivilegeEscalation: false.
    assert sc["allowPrivilegeEscalation"] is True
    assert "capabilities" not in sc


def test_default_security_context_is_least_privilege(default_render: Rendered) -> None:
    sc = default_render.container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # Root, because the cgroup / procfs / resctrl files it writes are root-owned 0644.
    assert sc["runAsUser"] == 0
    pod = default_render.pod_spec
    assert "securityContext" not in pod or "privileged" not in pod["securityContext"]
    assert pod.get("initContainers") is None
    assert pod["hostNetwork"] is False
    assert "hostIPC" not in pod


def test_added_capabilities_are_exactly_the_values(custom_render: Rendered) -> None:
    sc = custom_render.container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["seLinuxOptions"] == {"type": "spc_t"}
    assert sc["appArmorProfile"] == {"type": "Unconfined"}


def test_rbac_is_exactly_the_minimal_set(any_render: Rendered) -> None:
    assert rbac_grants(any_render) == MINIMAL_RBAC | REPORT_RBAC


def test_rbac_binds_the_agent_service_account(default_render: Rendered, custom_render: Rendered) -> None:
    for rendered, sa_name in ((default_render, "koordqos"), (custom_render, "custom-sa")):
        binding = rendered.one("ClusterRoleBinding")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": rendered.one("ClusterRole")["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa_name, "namespace": NAMESPACE}]
        assert rendered.pod_spec["serviceAccountName"] == sa_name
    assert default_render.one("ServiceAccount")["metadata"]["name"] == "koordqos"


def test_rbac_can_be_left_to_the_operator(chart: helm.Chart) -> None:
    rendered = render(chart, {"rbac": {"create": False}})
    assert rendered.of_kind("ClusterRole") == []
    assert rendered.of_kind("ClusterRoleBinding") == []


def test_probes_target_healthz_and_readyz_on_the_http_port(any_render: Rendered) -> None:
    container = any_render.container
    [port] = container["ports"]
    assert port["name"] == "http"
    assert f"--http-addr=0.0.0.0:{port['containerPort']}" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_node_agent_scheduling(any_render: Rendered) -> None:
    pod = any_render.pod_spec
    assert pod["hostPID"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    env = {e["name"]: e for e in any_render.container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert any_render.daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def test_resources_fit_the_memory_budget(default_render: Rendered) -> None:
    resources = default_render.container["resources"]
    assert set(resources) == {"requests", "limits"}
    # <= 120 MiB resident with 200 pods (docs/performance.md, "Whole agent at 200 and 1,000 pods"); the limit
    # must leave room above it.
    assert resources["requests"]["memory"] == "128Mi"
    assert resources["limits"]["memory"] == "256Mi"
    assert resources["requests"]["cpu"] == "100m"  # the 200-pod row of the scaling table, with churn


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def _millicores(quantity: str | int) -> int:
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


# The scaling table (docs/performance.md, "Scaling: 50 / 200 / 1,000 / 2,000 pods", bench/agent.py): resident
# memory at the end of the run, MiB, per pod count. The chart's presets must request at least that and limit
# at twice the request.
MEASURED_RSS_MIB = {200: 116, 1000: 152, 2000: 192}


@pytest.mark.parametrize("pods", sorted(MEASURED_RSS_MIB))
def test_sizing_presets_follow_the_scaling_table(chart: helm.Chart, pods: int) -> None:
    resources = render(chart, {"sizing": {"pods": pods}}).container["resources"]
    assert _mib(resources["requests"]["memory"]) >= MEASURED_RSS_MIB[pods]
    assert _mib(resources["limits"]["memory"]) >= 2 * _mib(resources["requests"]["memory"])
    assert _millicores(resources["limits"]["cpu"]) >= 4 * _millicores(resources["requests"]["cpu"])


def test_sizing_presets_grow_with_the_pods(chart: helm.Chart) -> None:
    rows = [render(chart, {"sizing": {"pods": n}}).container["resources"] for n in (200, 1000, 2000)]
    for small, large in itertools.pairwise(rows):
        assert _mib(large["requests"]["memory"]) > _mib(small["requests"]["memory"])
        assert _millicores(large["requests"]["cpu"]) > _millicores(small["requests"]["cpu"])


def test_explicit_resources_replace_the_preset(chart: helm.Chart) -> None:
    mine = {"requests": {"cpu": "300m", "memory": "200Mi"}, "limits": {"memory": "400Mi"}}
    assert render(chart, {"resources": mine, "sizing": {"pods": 2000}}).container["resources"] == mine


def test_a_pod_count_without_a_preset_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="sizing"):
        render(chart, {"sizing": {"pods": 500}})


def _mounts(rendered: Rendered) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """mountPath -> (volumeMount, volume)."""
    volumes = {v["name"]: v for v in rendered.pod_spec["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in rendered.container["volumeMounts"]}


def test_default_host_mounts(default_render: Rendered) -> None:
    mounts = _mounts(default_render)
    host = {
        path: (m.get("readOnly", False), v["hostPath"]["path"])
        for path, (m, v) in mounts.items()
        if "hostPath" in v
    }
    assert host == {
        "/host/cgroup": (False, "/sys/fs/cgroup"),
        "/host/proc": (False, "/proc"),
        "/host/sys": (True, "/sys"),
        "/var/run/nri": (True, "/var/run/nri"),
        # the kubelet's cpu_manager_state for the NRT (read-only; the directory: the file is replaced)
        "/host/kubelet": (True, "/var/lib/kubelet"),
        # the prediction models' checkpoints (written: one bounded file per model, docs/prediction.md)
        "/prediction-checkpoints": (False, "/var/run/koordqos/prediction-checkpoints"),
    }
    # The NRI socket's directory, not the socket file: a runtime restart recreates the socket.
    nri_volume = mounts["/var/run/nri"][1]["hostPath"]
    assert nri_volume["type"] == "DirectoryOrCreate"
    assert not any(v.get("hostPath", {}).get("type") == "Socket" for _, v in mounts.values())
    # No mount propagation back to the host.
    assert all("mountPropagation" not in m for m, _ in mounts.values())


def test_optional_host_mounts(custom_render: Rendered) -> None:
    mounts = _mounts(custom_render)
    assert mounts["/host/proc"][0]["readOnly"] is True
    resctrl_mount, resctrl_volume = mounts["/host/sys/fs/resctrl"]
    assert resctrl_volume["hostPath"]["path"] == "/sys/fs/resctrl"
    assert not resctrl_mount.get("readOnly", False)
    assert mounts["/var/run/koordlet"][1]["hostPath"]["path"] == "/var/run/koordlet"
    assert mounts["/etc/runtime/hookserver.d"][1]["hostPath"]["path"] == "/etc/runtime/hookserver.d"
    assert custom_render.pod_spec["hostNetwork"] is True
    assert custom_render.pod_spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_nri_disabled_drops_the_mount(chart: helm.Chart) -> None:
    rendered = render(chart, {"agent": {"nri": {"enabled": False}}})
    assert "/var/run/nri" not in _mounts(rendered)
    assert "--enable-nri=false" in rendered.container["args"]
    assert not any(a.startswith("--nri-socket") for a in rendered.container["args"])


def test_metrics_service_and_servicemonitor_select_the_agent(
    default_render: Rendered, custom_render: Rendered
) -> None:
    assert default_render.of_kind("Service") == []
    assert default_render.of_kind("ServiceMonitor") == []
    service = custom_render.one("Service")
    monitor = custom_render.one("ServiceMonitor")
    pod_labels = custom_render.daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [port] = service["spec"]["ports"]
    assert port == {"name": "http", "port": 19316, "targetPort": "http", "protocol": "TCP"}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http"
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_service_alone(chart: helm.Chart) -> None:
    rendered = render(chart, {"metrics": {"service": {"enabled": True}}})
    assert len(rendered.of_kind("Service")) == 1
    assert rendered.of_kind("ServiceMonitor") == []


def test_the_psi_rules_add_exactly_their_node_grants(chart: helm.Chart) -> None:
    """Gate PSIInterference: the node condition (nodes/status patch) and the taint (nodes get, patch)."""
    rendered = render(chart, {"agent": {"featureGates": {"PSIInterference": True}}})
    assert rbac_grants(rendered) - (MINIMAL_RBAC | REPORT_RBAC) == {
        ("", "nodes/status", "patch"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
    }
    off = render(chart, {"agent": {"featureGates": {"PSIInterference": False}}})
    assert rbac_grants(off) == MINIMAL_RBAC | REPORT_RBAC


def test_the_accelerators_gate_adds_exactly_the_device_grants(chart: helm.Chart) -> None:
    """Gate Accelerators: this node's Device (get, create, update); nothing without the gate."""
    rendered = render(chart, {"agent": {"featureGates": {"Accelerators": True}}})
    assert rbac_grants(rendered) - (MINIMAL_RBAC | REPORT_RBAC) == {
        ("scheduling.koordinator.sh", "devices", v) for v in ("get", "create", "update")
    }
    assert rbac_grants(render(chart, {})) == MINIMAL_RBAC | REPORT_RBAC


def test_the_blkio_gate_adds_exactly_the_claim_grants(chart: helm.Chart) -> None:
    """Gate BlkIOReconcile: the PVC watch (persistentvolumeclaims list, watch)."""
    rendered = render(chart, {"agent": {"featureGates": {"BlkIOReconcile": True}}})
    assert rbac_grants(rendered) - (MINIMAL_RBAC | REPORT_RBAC) == {
        ("", "persistentvolumeclaims", "list"),
        ("", "persistentvolumeclaims", "watch"),
    }


def _docs_rbac_rows() -> list[tuple[set[tuple[str, str, str]], bool]]:
    """docs/deployment.md's RBAC table: (grants of the row, whether the default values make them)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "deployment.md").read_text()
    table = page.split("<!-- rbac-table -->", 1)[1].split("<!-- /rbac-table -->", 1)[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        group, resource, verbs, default = (c.strip() for c in line.strip("|").split("|")[:4])
        grants = {(group.strip("`").strip('"'), resource, v.strip()) for v in verbs.split(",")}
        rows.append((grants, default == "yes"))
    return rows


def test_the_rbac_table_in_the_docs_is_the_chart(chart: helm.Chart, default_render: Rendered) -> None:
    """Every row of docs/deployment.md's RBAC table is a grant the chart makes, and nothing else: the rows
    marked default are exactly the default render's grants, all rows together exactly the grants with every
    feature on."""
    rows = _docs_rbac_rows()
    documented_default = set().union(*(g for g, default in rows if default))
    documented_all = set().union(*(g for g, _ in rows))
    assert rbac_grants(default_render) == documented_default
    everything = render(
        chart,
        {
            "agent": {
                "featureGates": {"PSIInterference": True, "Accelerators": True, "BlkIOReconcile": True}
            },
            "report": {"batchResourceSource": "agent"},
        },
    )
    assert rbac_grants(everything) == documented_all
