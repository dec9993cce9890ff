"""Kube actuators for the reports (docs/reporting.md, "Status writes", "NRT writes", "Batch formula"): the
NodeMetric status writer, the NodeResourceTopology writer and the standalone Node batch-resource patcher. Each
returns an explicit `WriteOutcome`; none raises for API errors.

NodeMetric (docs/reporting.md, "Status writes"): PUT `/status` with the last known resourceVersion; on 409 GET
the object from the API server (not a cache; docs/reporting.md) and retry, at most 4 attempts with backoff
10 ms × 5^k (jittered); 404 → `missing` (never create); 429/5xx/timeouts → `failed`, next round retries
(a 429's Retry-After is honoured); a token bucket (0.1 QPS, burst 2) and a minimum interval between writes;
no write when the report is unchanged within the minimum interval. The spec and metadata are never written.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from prometheus_client import Counter, Gauge

from koordqos import observability as obs
from koordqos.errors import KubeError
from koordqos.kube.client import ApiError, KubeClient

log = structlog.get_logger("koordqos.kube.reportwriters")

REPORTS = Counter(
    "koordqos_report_writes_total",
    "Report writes by object kind and outcome (written, unchanged, skipped, missing, limited, failed)",
    ["kind", "outcome"],
    registry=obs.REGISTRY,
)
CONFLICTS = Counter(
    "koordqos_report_conflicts_total",
    "HTTP 409 answers to report writes (each one retried after a fresh GET)",
    ["kind"],
    registry=obs.REGISTRY,
)
FAILURES = Counter(
    "koordqos_report_failures_total",
    "Report writes that failed (the round is dropped, the next one retries)",
    ["kind", "reason"],
    registry=obs.REGISTRY,
)
TARGET_MISSING = Gauge(
    "koordqos_report_target_missing",
    "1 while the object the agent reports into does not exist (NodeMetric is created by koord-manager)",
    ["kind"],
    registry=obs.REGISTRY,
)
LAST_WRITE = Gauge(
    "koordqos_report_last_write_timestamp_seconds",
    "Wall-clock time of the last successful report write",
    ["kind"],
    registry=obs.REGISTRY,
)

NODEMETRIC_PATH = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics/"
NRT_PATH = "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies"
Outcome = Literal["written", "unchanged", "skipped", "missing", "limited", "failed"]
Sleep = Callable[[float], Awaitable[None]]
#: read-modify-write step: the object in the cluster (None: absent) → the object to write (None: no change)
ClientSource = KubeClient | Callable[[], Awaitable[KubeClient]]
Modify = Callable[[Mapping[str, Any] | None], dict[str, Any] | None]


def same_report(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Two statuses carry the same data (`updateTime` aside)."""
    if a is None or b is None:
        return a is b
    return {k: v for k, v in a.items() if k != "updateTime"} == {
        k: v for k, v in b.items() if k != "updateTime"
    }


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What a write did: outcome, attempts made, conflicts met, the error or reason, the new version."""

    outcome: Outcome
    attempts: int = 0
    conflicts: int = 0
    detail: str = ""
    resource_version: str = ""


class TokenBucket:
    """`rate` tokens per second up to `burst`; `take()` is False when none is left (the write is dropped)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class _Client:
    """A KubeClient given directly or obtained lazily (the agent's shared connection)."""

    def __init__(self, source: ClientSource) -> None:
        self._source = source

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        src = self._source
        client = src if isinstance(src, KubeClient) else await src()
        return await client.request(method, path, **kw)


def _backoff(attempt: int) -> float:
    """client-go `retry.DefaultBackoff`: 10 ms × 5^k, jitter 0.1."""
    base: float = 0.01 * 5.0**attempt
    return base * (1 + random.random() * 0.1)


class NodeMetricWriter:
    """Writes this node's NodeMetric status (never creates, deletes or touches its spec)."""

    kind = "NodeMetric"

    def __init__(
        self,
        client: ClientSource,
        node_name: str,
        *,
        min_write_interval: float = 10.0,
        qps: float = 0.1,
        burst: int = 2,
        attempts: int = 4,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.client = _Client(client)
        self.path = NODEMETRIC_PATH + node_name
        self.min_write_interval = min_write_interval
        self.attempts = attempts
        self.clock = clock
        self.sleep = sleep
        self.bucket = TokenBucket(qps, burst, clock)
        self.cached: dict[str, Any] | None = None  # the object as last read or written
        self.last_status: dict[str, Any] | None = None
        self.last_written_at: float | None = None  # monotonic
        self._not_before = 0.0  # Retry-After
        self._in_flight = asyncio.Lock()

    async def read(self) -> dict[str, Any] | None:
        """GET the object from the API server; None when it does not exist; KubeError on other failures."""
        try:
            obj = await self.client.request("GET", self.path)
        except ApiError as exc:
            if exc.status == 404:
                self._missing(True)
                self.cached = None
                return None
            raise
        self._missing(False)
        self.cached = obj
        return obj

    def _missing(self, missing: bool) -> None:
        TARGET_MISSING.labels(self.kind).set(1 if missing else 0)

    def _count(self, outcome: WriteOutcome) -> WriteOutcome:
        REPORTS.labels(self.kind, outcome.outcome).inc()
        return outcome

    async def write(self, status: Mapping[str, Any]) -> WriteOutcome:
        """Replace the status (one write in flight at a time)."""
        async with self._in_flight:
            return self._count(await self._write(dict(status)))

    async def _write(self, status: dict[str, Any]) -> WriteOutcome:
        now = self.clock()
        if now < self._not_before:
            return WriteOutcome("skipped", detail="waiting for Retry-After")
        recent = self.last_written_at is not None and now - self.last_written_at < self.min_write_interval
        if recent and same_report(self.last_status, status):
            return WriteOutcome("unchanged")
        if recent:
            return WriteOutcome("limited", detail="minimum write interval")
        if not self.bucket.take():
            return WriteOutcome("limited", detail="write rate limit")
        conflicts = 0
        obj = self.cached
        for attempt in range(self.attempts):
            try:
                if obj is None:
                    obj = await self.read()
                    if obj is None:
                        return WriteOutcome("missing", attempt + 1, conflicts, "NodeMetric not found")
                body = copy.deepcopy(obj)
                body["status"] = status
                written = await self.client.request("PUT", self.path + "/status", body=body)
            except ApiError as exc:
                if exc.status == 409:
                    conflicts += 1
                    CONFLICTS.labels(self.kind).inc()
                    obj = None  # re-read from the API server, not a cache (docs/reporting.md)
                    if attempt + 1 < self.attempts:
                        await self.sleep(_backoff(attempt))
                    continue
                if exc.status == 404:
                    self._missing(True)
                    self.cached = None
                    return WriteOutcome("missing", attempt + 1, conflicts, str(exc))
                if exc.retry_after:
                    self._not_before = self.clock() + exc.retry_after
                FAILURES.labels(self.kind, str(exc.status)).inc()
                return WriteOutcome("failed", attempt + 1, conflicts, str(exc))
            except KubeError as exc:
                FAILURES.labels(self.kind, "transport").inc()
                return WriteOutcome("failed", attempt + 1, conflicts, str(exc))
            self._missing(False)
            self.cached = written
            self.last_status = status
            self.last_written_at = self.clock()
            LAST_WRITE.labels(self.kind).set(time.time())
            rv = str((written.get("metadata") or {}).get("resourceVersion", ""))
            return WriteOutcome("written", attempt + 1, conflicts, resource_version=rv)
        FAILURES.labels(self.kind, "conflict").inc()
        return WriteOutcome("failed", self.attempts, conflicts, "conflict retries exhausted")


class NRTWriter:
    """Creates this node's NodeResourceTopology and keeps the agent-owned parts current (docs/reporting.md,
    "NRT writes")."""

    kind = "NodeResourceTopology"

    def __init__(
        self, client: ClientSource, node_name: str, *, attempts: int = 5, sleep: Sleep = asyncio.sleep
    ) -> None:
        self.client = _Client(client)
        self.node_name = node_name
        self.collection = NRT_PATH  # a subclass writes another cluster-scoped kind (kube/device.py)
        self.path = f"{self.collection}/{node_name}"
        self.attempts = attempts
        self.sleep = sleep
        self.last: dict[str, Any] | None = None  # the object as last read or written

    def _count(self, outcome: WriteOutcome) -> WriteOutcome:
        REPORTS.labels(self.kind, outcome.outcome).inc()
        return outcome

    async def sync(self, modify: Modify) -> WriteOutcome:
        """GET, `modify`, then POST (absent) or PUT (changed); on 409/429 re-GET and re-apply `modify`."""
        conflicts = 0
        for attempt in range(self.attempts):
            try:
                try:
                    current: dict[str, Any] | None = await self.client.request("GET", self.path)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    current = None
                body = modify(current)
                if body is None:
                    self.last = current
                    return self._count(WriteOutcome("unchanged", attempt + 1, conflicts))
                if current is None:
                    try:
                        written = await self.client.request("POST", self.collection, body=body)
                    except ApiError as create_exc:
                        if create_exc.status != 409:  # AlreadyExists: someone else made it; update it
                            raise
                        continue
                    detail = "created"
                else:
                    written = await self.client.request("PUT", self.path, body=body)
                    detail = "updated"
            except ApiError as exc:
                if exc.status in (409, 429):
                    conflicts += 1
                    CONFLICTS.labels(self.kind).inc()
                    if attempt + 1 < self.attempts:
                        await self.sleep(max(_backoff(attempt), exc.retry_after or 0.0))
                    continue
                FAILURES.labels(self.kind, str(exc.status)).inc()
                return self._count(WriteOutcome("failed", attempt + 1, conflicts, str(exc)))
            except KubeError as exc:
                FAILURES.labels(self.kind, "transport").inc()
                return self._count(WriteOutcome("failed", attempt + 1, conflicts, str(exc)))
            self.last = written
            LAST_WRITE.labels(self.kind).set(time.time())
            rv = str((written.get("metadata") or {}).get("resourceVersion", ""))
            return self._count(WriteOutcome("written", attempt + 1, conflicts, detail, rv))
        FAILURES.labels(self.kind, "conflict").inc()
        return self._count(WriteOutcome("failed", self.attempts, conflicts, "conflict retries exhausted"))


class NodeBatchPatcher:
    """Standalone mode: merge-PATCH the Node's status capacity/allocatable batch resources (None removes)."""

    kind = "Node"

    def __init__(self, client: ClientSource, node_name: str) -> None:
        self.client = _Client(client)
        self.path = f"/api/v1/nodes/{node_name}/status"

    async def patch(self, resources: Mapping[str, str | None]) -> WriteOutcome:
        """Set (or, with None values, delete) extended resources in capacity and allocatable."""
        body = {"status": {"capacity": dict(resources), "allocatable": dict(resources)}}
        try:
            obj = await self.client.request(
                "PATCH", self.path, body=body, content_type="application/merge-patch+json"
            )
        except KubeError as exc:
            reason = str(exc.status) if isinstance(exc, ApiError) else "transport"
            FAILURES.labels(self.kind, reason).inc()
            outcome = WriteOutcome("failed", 1, 0, str(exc))
        else:
            LAST_WRITE.labels(self.kind).set(time.time())
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            outcome = WriteOutcome("written", 1, 0, resource_version=rv)
        REPORTS.labels(self.kind, outcome.outcome).inc()
        return outcome
