"""Prometheus metrics of the metrics collector (on koordqos.observability.REGISTRY)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from koordqos import observability as obs

MISSING = Counter(
    "koordqos_metrics_missing_total",
    "Samples not taken because a source file or cgroup was missing or malformed",
    ["source"],
    registry=obs.REGISTRY,
)
HOST_APP_REFUSED = Counter(
    "koordqos_metrics_host_app_refused_total",
    "NodeSLO host applications not measured because their cgroupPath was refused",
    ["reason"],
    registry=obs.REGISTRY,
)
ROUND_SECONDS = Histogram(
    "koordqos_metrics_round_seconds",
    "CPU time of one metrics collection round",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1),
    registry=obs.REGISTRY,
)
