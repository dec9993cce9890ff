"""Prometheus metrics of the NRI plugin (on koordqos.observability.REGISTRY)."""

from __future__ import annotations

from prometheus_client import Counter

from koordqos.observability import REGISTRY, FastCounter, LoopHistogram

RECONNECTS = Counter(
    "koordqos_nri_reconnects_total",
    "Connection attempts to the NRI runtime after the first one",
    registry=REGISTRY,
)
CONNECT_FAILURES = Counter(
    "koordqos_nri_connect_failures_total",
    "NRI connection or registration attempts that failed, by reason",
    ["reason"],
    registry=REGISTRY,
)
PROTOCOL_ERRORS = Counter(
    "koordqos_nri_protocol_errors_total",
    "Connections dropped for a broken byte stream: malformed frames, oversize messages, stream-id violations",
    ["role"],
    registry=REGISTRY,
)
MALFORMED_REQUESTS = Counter(
    "koordqos_nri_malformed_requests_total",
    "Requests in intact frames whose envelope or payload does not parse: answered INVALID_ARGUMENT, "
    "connection kept",
    ["role", "method"],
    registry=REGISTRY,
)
DROPPED_MESSAGES = Counter(
    "koordqos_nri_dropped_messages_total",
    "Frames or ttrpc messages ignored (unknown conn id, data frames, responses to inactive streams)",
    ["role", "kind"],
    registry=REGISTRY,
)
REQUESTS = FastCounter(
    "koordqos_nri_requests_total",
    "NRI calls served by the plugin, by method and outcome",
    ["method", "outcome"],
    registry=REGISTRY,
)
REQUEST_SECONDS = LoopHistogram(
    "koordqos_nri_request_seconds",
    "Plugin-side time per NRI call (decode, hooks, encode)",
    ["method"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2),
    registry=REGISTRY,
)
BUSY_POLL_GATE_ERRORS = Counter(
    "koordqos_nri_busy_poll_gate_errors_total",
    "Times the busy-poll gate could not read the node's CPU from the proc root's stat and fell back to the "
    "metrics round's view (counted once per stretch of failures)",
    registry=REGISTRY,
)
BUSY_POLL_WINDOWS = FastCounter(
    "koordqos_nri_busy_poll_windows_total",
    "Polling windows after a reply (nri.busy_poll_seconds): caught (the runtime's next request came within "
    "the window), expired (the loop went to sleep after it) or skipped (no core was idle: none opened)",
    ["outcome"],
    registry=REGISTRY,
)
