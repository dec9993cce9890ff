"""The optional monitoring objects: the Grafana dashboard ConfigMap and the PrometheusRule."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

from .chart_render import CHART_DIR, KUBE_VERSION, NAMESPACE, Rendered, render
from .exported_metrics import PROMETHEUS_SERIES, exported_series, referenced_metrics, unknown_metrics
from .operator_schemas import PROMETHEUSRULE_SCHEMA

DASHBOARD_FILE = CHART_DIR / "dashboards" / "koordqos.json"
MONITORING = {"metrics": {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


@pytest.fixture(scope="module")
def monitoring_render(chart: helm.Chart) -> Rendered:
    return render(chart, MONITORING)


def _rules(rendered: Rendered) -> dict[str, dict[str, Any]]:
    [group] = rendered.one("PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


# -- the dashboard JSON ----------------------------------------------------------------------------------


def test_exported_series_come_from_the_agent_registry() -> None:
    names = exported_series()
    # one of each metric type, from modules in different layers
    assert {"koordqos_ready", "koordqos_decisions_total", "koordqos_event_loop_lag_seconds_bucket"} <= names
    assert {"koordqos_nri_request_seconds_bucket", "koordqos_be_suppress_cores"} <= names
    assert "koordqos_decisions" not in names  # a counter's series carry _total


def test_the_name_check_rejects_a_metric_the_agent_does_not_export() -> None:
    assert unknown_metrics("rate(koordqos_decisions_total[5m])") == set()
    assert unknown_metrics("rate(koordqos_decision_total[5m]) + koordqos_ready") == {
        "koordqos_decision_total"
    }


def test_dashboard_is_json_with_unique_panel_ids(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "koordqos-node-agent"
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard):
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"


def test_every_dashboard_query_names_exported_metrics(dashboard: dict[str, Any]) -> None:
    queries = _queries(dashboard)
    assert len(queries) >= 10
    for expr in queries:
        assert referenced_metrics(expr), f"query names no koordqos metric: {expr}"
        assert unknown_metrics(expr) == set(), f"{expr}: not exported by the agent"


def test_dashboard_has_the_operator_figures(dashboard: dict[str, Any]) -> None:
    by_title = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in _panels(dashboard)}
    cap_vs_used = " ".join(by_title["BE CPU cap vs LS usage"])
    assert "koordqos_be_suppress_cores" in cap_vs_used
    assert "koordqos_be_suppress_ls_used_cores" in cap_vs_used
    assert "by (strategy, action)" in by_title["Decisions by strategy"][0]
    assert any("koordqos_pod_evictions_total" in e for e in by_title["Evictions"])
    assert "by (node, namespace, pod, reason)" in by_title["Evicted pods (time range)"][0]
    assert any("koordqos_nri_connected" in e for e in by_title["NRI connection and reconnects"])
    assert "koordqos_nri_request_seconds_bucket" in by_title["NRI request latency p99 (plugin side)"][0]
    assert "by (node, outcome)" in by_title["NRI busy-poll windows (per second)"][0]
    assert "koordqos_event_loop_lag_seconds_bucket" in by_title["Event-loop lag p99"][0]
    # every figure can be narrowed to a node
    for expr in _queries(dashboard)[:-1]:
        assert 'node=~"$node"' in expr, expr


# -- the rendered objects --------------------------------------------------------------------------------


def test_monitoring_objects_are_off_by_default(default_render: Rendered) -> None:
    assert default_render.of_kind("ConfigMap") == []
    assert default_render.of_kind("PrometheusRule") == []


def test_dashboard_configmap_carries_the_sidecar_label_and_the_json(monitoring_render: Rendered) -> None:
    cm = monitoring_render.one("ConfigMap")
    kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert json.loads(cm["data"]["koordqos.json"]) == json.loads(DASHBOARD_FILE.read_text())


def test_dashboard_sidecar_label_and_namespace_are_values(chart: helm.Chart) -> None:
    values = {
        "metrics": {
            "grafanaDashboard": {
                "enabled": True,
                "sidecarLabel": "grafana.example/dashboard",
                "sidecarLabelValue": "koordqos",
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "Node agents"},
            }
        }
    }
    cm = render(chart, values).one("ConfigMap")
    kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)
    assert cm["metadata"]["labels"]["grafana.example/dashboard"] == "koordqos"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Node agents"}


def test_prometheusrule_validates_and_has_the_four_alerts(monitoring_render: Rendered) -> None:
    rule = monitoring_render.one("PrometheusRule")
    jsonschema.Draft202012Validator(PROMETHEUSRULE_SCHEMA).validate(rule)
    rules = _rules(monitoring_render)
    assert set(rules) == {
        "KoordQoSAgentDown",
        "KoordQoSNRIDisconnected",
        "KoordQoSEvictionBurst",
        "KoordQoSEventLoopLag",
    }
    assert 'up{job="koordqos"} == 0' in rules["KoordQoSAgentDown"]["expr"]
    assert rules["KoordQoSNRIDisconnected"]["expr"] == "koordqos_nri_connected == 0"
    assert "[10m])) > 5" in rules["KoordQoSEvictionBurst"]["expr"]
    assert rules["KoordQoSEventLoopLag"]["expr"].endswith("> 0.05")
    for r in rules.values():
        assert r["labels"]["severity"] == "warning"
        assert "{{ $labels.node }}" in r["annotations"]["summary"]


def test_every_alert_names_exported_metrics(monitoring_render: Rendered) -> None:
    for name, r in _rules(monitoring_render).items():
        assert referenced_metrics(r["expr"]), name
        assert unknown_metrics(r["expr"]) == set(), f"{name}: {r['expr']}"


def test_alert_thresholds_are_values_and_nri_alert_follows_nri(chart: helm.Chart) -> None:
    values = {
        "agent": {"nri": {"enabled": False}},
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "severity": "critical",
                "evictionBurstCount": 20,
                "evictionBurstWindow": "30m",
                "loopLagSeconds": 0.2,
                "loopLagFor": "15m",
                "labels": {"release": "prometheus"},
            }
        },
    }
    rendered = render(chart, values)
    rule = rendered.one("PrometheusRule")
    jsonschema.Draft202012Validator(PROMETHEUSRULE_SCHEMA).validate(rule)
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    rules = _rules(rendered)
    assert "KoordQoSNRIDisconnected" not in rules
    assert "[30m])) > 20" in rules["KoordQoSEvictionBurst"]["expr"]
    assert rules["KoordQoSEventLoopLag"]["expr"].endswith("> 0.2")
    assert rules["KoordQoSEventLoopLag"]["for"] == "15m"
    assert {r["labels"]["severity"] for r in rules.values()} == {"critical"}


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"metrics": {"prometheusRule": {"evictionBurstWindow": "ten"}}}, "evictionBurstWindow"),
        ({"metrics": {"prometheusRule": {"loopLagSeconds": 0}}}, "loopLagSeconds"),
        ({"metrics": {"grafanaDashboard": {"sidecarLable": "x"}}}, "sidecarLable"),
    ],
)
def test_values_schema_rejects_bad_monitoring_values(
    chart: helm.Chart, values: dict[str, Any], field: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=field):
        chart.render(values, name="koordqos", namespace=NAMESPACE)


def test_up_is_the_only_non_agent_series_in_the_alerts(monitoring_render: Rendered) -> None:
    expr = _rules(monitoring_render)["KoordQoSAgentDown"]["expr"]
    assert expr.split("{")[0] in PROMETHEUS_SERIES
