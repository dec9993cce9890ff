"""Prometheus metrics shared by every component (one registry, defined once per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

DECISIONS = Counter(
    "koordqos_decisions_total",
    "Actions taken (or recorded in dry-run) by strategy and action",
    ["strategy", "action", "dry_run"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "koordqos_errors_total",
    "Errors handled without stopping the agent, by component and kind",
    ["component", "kind"],
    registry=REGISTRY,
)
SUBSCRIBER_ERRORS = Counter(
    "koordqos_bus_subscriber_errors_total",
    "Exceptions raised by bus subscribers",
    ["subscriber"],
    registry=REGISTRY,
)
BUS_EVENTS = Counter(
    "koordqos_bus_events_total",
    "Events published on the bus by type",
    ["type"],
    registry=REGISTRY,
)
BUS_COALESCED = Counter(
    "koordqos_bus_coalesced_total",
    "Tick events replaced by a newer one before delivery",
    ["subscriber"],
    registry=REGISTRY,
)
BUS_BACKPRESSURE = Counter(
    "koordqos_bus_backpressure_total",
    "Times a publisher waited for a full subscriber queue",
    ["subscriber"],
    registry=REGISTRY,
)
HOOK_ERRORS = Counter(
    "koordqos_hook_errors_total",
    "Runtime hook failures (kind: error, timeout) in runtime calls (NRI requests, proxy RPCs)",
    ["hook", "kind"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "koordqos_bus_request_seconds",
    "Time to serve one runtime call (NRI request, proxy RPC) in the hook core, by call",
    ["type"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2),
    registry=REGISTRY,
)
COMPONENT_RESTARTS = Counter(
    "koordqos_component_restarts_total",
    "Component crashes followed by a restart",
    ["component"],
    registry=REGISTRY,
)
LOOP_LAG = Histogram(
    "koordqos_event_loop_lag_seconds",
    "How late the event loop woke a periodic probe",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
    registry=REGISTRY,
)
READY = Gauge("koordqos_ready", "1 once the pod, Node and NodeSLO sources have synced", registry=REGISTRY)
NRI_CONNECTED = Gauge(
    "koordqos_nri_connected", "1 while the NRI plugin is registered with a runtime", registry=REGISTRY
)
