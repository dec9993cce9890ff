"""Prometheus metrics of the RuntimeHookService (koordqos.observability.REGISTRY)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from koordqos import observability as obs

REQUESTS = Counter(
    "koordqos_proxy_requests_total",
    "RuntimeHookService calls by method and outcome (ok, invalid_argument, hook_error, internal_error)",
    ["method", "outcome"],
    registry=obs.REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "koordqos_proxy_request_seconds",
    "Server-side duration of one RuntimeHookService call (decode, hooks, pod cgroup writes, encode)",
    ["method"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0),
    registry=obs.REGISTRY,
)
SERVING = Gauge(
    "koordqos_proxy_serving",
    "1 while the RuntimeHookService listens on its unix socket",
    registry=obs.REGISTRY,
)
REGISTRATION_WRITES = Counter(
    "koordqos_proxy_registration_writes_total",
    "Writes of the koord-runtime-proxy registration file by outcome (written, failed)",
    ["outcome"],
    registry=obs.REGISTRY,
)
OPEN_CONNECTIONS = Gauge(
    "koordqos_proxy_open_connections",
    "Connections to the RuntimeHookService socket now open",
    registry=obs.REGISTRY,
)
REFUSED_CONNECTIONS = Counter(
    "koordqos_proxy_refused_connections_total",
    "Connections closed at accept because --runtime-hooks-max-connections were already open",
    registry=obs.REGISTRY,
)
