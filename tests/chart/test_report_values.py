"""Chart values of the reports: each reporter can be turned off, and RBAC follows (least privilege:
`nodes/status` patch only in standalone batch mode) — docs/deployment.md, "RBAC"."""

from __future__ import annotations

import helm_python as helm

from koordqos.cli import build_parser

from .chart_render import render
from .test_security import MINIMAL_RBAC, REPORT_RBAC, rbac_grants

NODEMETRIC_READ = {("slo.koordinator.sh", "nodemetrics", "get")}
NODEMETRIC_WRITE = {("slo.koordinator.sh", "nodemetrics/status", "update")}
NRT = {("topology.node.k8s.io", "noderesourcetopologies", v) for v in ("get", "create", "update")}
PROXY = {("", "nodes/proxy", "get")}
NODE_STATUS = {("", "nodes/status", "patch")}


def _args(rendered: object) -> list[str]:
    pod = rendered.pod_spec  # type: ignore[attr-defined]
    return list(pod["containers"][0]["args"])


def test_defaults_report_both_objects(chart: helm.Chart) -> None:
    rendered = render(chart, None)
    args = _args(rendered)
    assert "--enable-node-metric-report=true" in args
    assert "--batch-resource-source=manager" in args
    assert not any(a.startswith("--feature-gates") and "NodeTopologyReport=false" in a for a in args)
    assert NODE_STATUS.isdisjoint(rbac_grants(rendered))
    mounts = {m["name"]: m for m in rendered.pod_spec["containers"][0]["volumeMounts"]}
    assert mounts["kubelet"] == {"name": "kubelet", "mountPath": "/host/kubelet", "readOnly": True}
    build_parser().parse_args(args)  # the CLI accepts them


def test_each_reporter_can_be_turned_off(chart: helm.Chart) -> None:
    off = render(
        chart, {"report": {"nodeMetric": {"enabled": False}, "nodeResourceTopology": {"enabled": False}}}
    )
    args = _args(off)
    assert "--enable-node-metric-report=false" in args
    assert "--feature-gates=NodeTopologyReport=false" in args
    assert rbac_grants(off) == MINIMAL_RBAC
    only_nrt = render(chart, {"report": {"nodeMetric": {"enabled": False}}})
    assert rbac_grants(only_nrt) == MINIMAL_RBAC | NRT | PROXY
    no_proxy = render(chart, {"report": {"kubelet": {"queryConfig": False, "readCheckpoint": False}}})
    assert rbac_grants(no_proxy) == MINIMAL_RBAC | REPORT_RBAC - PROXY
    assert "--disable-query-kubelet-config=true" in _args(no_proxy)
    assert all(m["name"] != "kubelet" for m in no_proxy.pod_spec["containers"][0]["volumeMounts"])


def test_user_gate_wins_over_the_nrt_switch(chart: helm.Chart) -> None:
    rendered = render(
        chart,
        {
            "agent": {"featureGates": {"NodeTopologyReport": True}},
            "report": {"nodeResourceTopology": {"enabled": False}},
        },
    )
    assert "--feature-gates=NodeTopologyReport=true" in _args(rendered)


def test_standalone_grants_node_status_patch_only_then(chart: helm.Chart) -> None:
    rendered = render(chart, {"report": {"batchResourceSource": "agent", "nodeMetric": {"enabled": False}}})
    grants = rbac_grants(rendered)
    assert grants >= NODE_STATUS
    assert grants >= NODEMETRIC_READ  # to refuse when koord-manager's NodeMetric exists
    assert NODEMETRIC_WRITE.isdisjoint(grants)
    args = _args(rendered)
    assert "--batch-resource-source=agent" in args
    build_parser().parse_args(args)


def test_kubelet_overrides_are_passed(chart: helm.Chart) -> None:
    rendered = render(chart, {"report": {"kubelet": {"cpuManagerPolicy": "static", "reservedCPUs": "0-1"}}})
    args = _args(rendered)
    assert "--kubelet-cpu-manager-policy=static" in args
    assert "--kubelet-reserved-cpus=0-1" in args
    build_parser().parse_args(args)


def test_prediction_checkpoints_are_a_host_directory(chart: helm.Chart) -> None:
    rendered = render(chart, None)
    args = _args(rendered)
    assert "--enable-prediction=true" in args
    assert "--prediction-checkpoint-filepath=/prediction-checkpoints" in args
    mounts = {m["name"]: m for m in rendered.pod_spec["containers"][0]["volumeMounts"]}
    assert mounts["prediction-checkpoints"] == {
        "name": "prediction-checkpoints",
        "mountPath": "/prediction-checkpoints",
    }
    volumes = {v["name"]: v for v in rendered.pod_spec["volumes"]}
    assert volumes["prediction-checkpoints"]["hostPath"] == {
        "path": "/var/run/koordqos/prediction-checkpoints",
        "type": "DirectoryOrCreate",
    }
    build_parser().parse_args(args)
    moved = render(chart, {"report": {"prediction": {"checkpointHostPath": "/var/lib/koordqos/models"}}})
    assert {v["name"]: v for v in moved.pod_spec["volumes"]}["prediction-checkpoints"]["hostPath"][
        "path"
    ] == ("/var/lib/koordqos/models")
    off = render(chart, {"report": {"prediction": {"enabled": False}}})
    assert "--enable-prediction=false" in _args(off)
    assert not any(a.startswith("--prediction-checkpoint-filepath") for a in _args(off))
    assert all(v["name"] != "prediction-checkpoints" for v in off.pod_spec["volumes"])
