"""Evictor: policy/v1 Eviction with a UID precondition (docs/behaviour-qos-manager.md, "Eviction").

* A pod whose UID was evicted in the last `ttl` seconds (2 min) is reported evicted without any call.
* Success (200/201): Warning Event `evictPodSuccess` "evict Pod:<ns>/<name>, reason: <r>, message: <m>",
  UID cached, counted, True.
* Failure: Warning Event `evictPodFail` with ", error <err>" appended, False. This includes 429 (a
  PodDisruptionBudget forbids it now: the strategy retries on a later round, nothing is cached), 404 (the pod
  is gone) and 409 (the UID precondition failed: a different pod now has that name).
* A pod whose eviction failed is backed off: no call (and no Event) until 1 s, then 2 s, 4 s, … (capped) have
  passed; a success or a change of the pod (new resourceVersion) resets it. A PDB-blocked pod is thus asked
  about a handful of times a minute, not once per strategy round, and still evicted once the budget allows.
* Calls are rate-limited to `qps` per second (token bucket).
* Dry-run, and local mode: the decision is recorded, nothing is called, and the result is True (UID cached)
  so the decisions show what a real run would do.
Every attempt is a decision in the decision log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import quote

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.decisions import DecisionLog
from koordqos.errors import KoordQoSError
from koordqos.kube.client import ApiError, KubeClient
from koordqos.kube.eventrecorder import EventRecorder, pod_reference
from koordqos.model.pod import PodInfo

log = structlog.get_logger("koordqos.kube.evictor")

EVICTIONS = Counter(
    "koordqos_pod_evictions_total",
    "Pod eviction attempts by reason and result, with the pod (koordinator#1117: which pods were evicted)",
    ["reason", "result", "namespace", "pod"],
    registry=obs.REGISTRY,
)

#: pods with series of their own in EVICTIONS; the oldest pod's series go when another one comes (a node
#: that evicts for days must not grow /metrics without bound)
EVICTION_SERIES_PODS = 200
_RESULTS = ("recorded", "success", "failed")


class EvictionSeries:
    """EVICTIONS counted with the pod's labels, for the last `limit` pods evicted (oldest forgotten first)."""

    def __init__(self, limit: int = EVICTION_SERIES_PODS) -> None:
        self.limit = limit
        self._pods: dict[tuple[str, str], set[str]] = {}  # (namespace, pod) → its reasons, oldest first

    def inc(self, reason: str, result: str, namespace: str, pod: str) -> None:
        key = (namespace, pod)
        reasons = self._pods.pop(key, set())
        reasons.add(reason)
        self._pods[key] = reasons  # now the newest
        EVICTIONS.labels(reason, result, namespace, pod).inc()
        while len(self._pods) > self.limit:
            (old_ns, old_pod), old_reasons = next(iter(self._pods.items()))
            del self._pods[(old_ns, old_pod)]
            for r in old_reasons:
                for res in _RESULTS:
                    try:
                        EVICTIONS.remove(r, res, old_ns, old_pod)
                    except KeyError:
                        pass  # that result never happened for the pod

    def __len__(self) -> int:
        return len(self._pods)


EVICTION_PODS = EvictionSeries()

BACKOFF_SKIPPED = Counter(
    "koordqos_eviction_backoff_skipped_total",
    "Eviction attempts not sent because the pod's last eviction failed recently (per-pod back-off)",
    registry=obs.REGISTRY,
)

REASON_SUCCESS = "evictPodSuccess"
REASON_FAIL = "evictPodFail"
EVICTED_TTL_SECONDS = 120.0


class EvictorService(Protocol):
    """What the QoS strategies evict through."""

    async def evict(self, pod: PodInfo, reason: str, message: str, strategy: str) -> bool: ...

    def is_evicted(self, pod: PodInfo) -> bool: ...


class TokenBucket:
    """`qps` tokens per second, at most `burst` saved; `acquire` waits for a token."""

    def __init__(
        self,
        qps: float,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.qps = qps
        self._sleep = sleep
        self.burst = burst if burst is not None else max(1, int(qps))
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now

    async def acquire(self) -> None:
        """Take one token, waiting until one is available (callers are served in order)."""
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                await self._sleep((1 - self._tokens) / self.qps)
                self._refill()
            self._tokens -= 1


class EvictedCache:
    """UID → expiry; entries live `ttl` seconds."""

    def __init__(self, ttl: float = EVICTED_TTL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._expiry: dict[str, float] = {}

    def add(self, uid: str) -> None:
        """Remember `uid` for ttl seconds."""
        self._gc()
        self._expiry[uid] = self._clock() + self.ttl

    def __contains__(self, uid: object) -> bool:
        exp = self._expiry.get(uid) if isinstance(uid, str) else None
        return exp is not None and exp > self._clock()

    def _gc(self) -> None:
        now = self._clock()
        for uid in [u for u, e in self._expiry.items() if e <= now]:
            del self._expiry[uid]

    def __len__(self) -> int:
        self._gc()
        return len(self._expiry)


class EvictionBackoff:
    """Per-pod exponential back-off after failed evictions: `base`, 2×, 4× … up to `cap` seconds.

    An entry is keyed by UID and remembers the pod's resourceVersion: a changed pod starts afresh. Entries
    whose wait is long over are dropped, so the memory is bounded by the pods failing now.
    """

    def __init__(
        self, base: float = 1.0, cap: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base = base
        self.cap = cap
        self._clock = clock
        self._entries: dict[str, tuple[str, float, float]] = {}  # uid -> (resourceVersion, delay, until)

    def waiting(self, pod: PodInfo) -> bool:
        """The pod failed recently and has not changed since: do not call the API yet."""
        entry = self._entries.get(pod.uid)
        if entry is None:
            return False
        version, _delay, until = entry
        if version != pod.resource_version:
            del self._entries[pod.uid]
            return False
        return self._clock() < until

    def failed(self, pod: PodInfo) -> float:
        """Record a failure; returns the wait before the next attempt."""
        now = self._clock()
        self._prune(now)
        entry = self._entries.get(pod.uid)
        delay = self.base
        if entry is not None and entry[0] == pod.resource_version:
            delay = min(self.cap, entry[1] * 2)
        self._entries[pod.uid] = (pod.resource_version, delay, now + delay)
        return delay

    def succeeded(self, pod: PodInfo) -> None:
        """Forget the pod's failures."""
        self._entries.pop(pod.uid, None)

    def _prune(self, now: float) -> None:
        if len(self._entries) < 1024:
            return
        for uid in [u for u, (_, _, until) in self._entries.items() if until + self.cap < now]:
            del self._entries[uid]

    def __len__(self) -> int:
        return len(self._entries)


def event_message(pod: PodInfo, reason: str, message: str) -> str:
    """koordlet's event text."""
    return f"evict Pod:{pod.namespace}/{pod.name}, reason: {reason}, message: {message}"


class Evictor:
    """Eviction through the API (cluster mode) or as logged decisions only (dry-run, local mode)."""

    def __init__(
        self,
        decisions: DecisionLog,
        client: Callable[[], Awaitable[KubeClient]] | None,
        recorder: EventRecorder | None,
        qps: float = 5.0,
        dry_run: bool = False,
        ttl: float = EVICTED_TTL_SECONDS,
        backoff_cap: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.decisions = decisions
        self._client = client
        self.recorder = recorder
        self.dry_run = dry_run
        self.limiter = TokenBucket(qps)
        self.evicted = EvictedCache(ttl, clock)
        self.backoff = EvictionBackoff(cap=backoff_cap, clock=clock)
        self._recording = client is not None and not dry_run
        # uid → the eviction under way: CPUEvict and MemoryEvict run on separate tasks, and both may pick the
        # same pod while the first call waits for the rate limiter or the API server
        self._in_flight: dict[str, asyncio.Future[bool]] = {}

    def is_evicted(self, pod: PodInfo) -> bool:
        """The pod's UID was evicted within the cache TTL."""
        return pod.uid in self.evicted

    async def evict(self, pod: PodInfo, reason: str, message: str, strategy: str) -> bool:
        """Evict `pod` once; True if evicted now or already within the TTL.

        A second call for a pod whose eviction is still under way waits for that one's result instead of
        calling the API again.
        """
        if pod.uid in self.evicted:
            return True
        if self.backoff.waiting(pod):
            BACKOFF_SKIPPED.inc()
            return False
        pending = self._in_flight.get(pod.uid)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._in_flight[pod.uid] = fut
        ok = False
        try:
            ok = await self._evict(pod, reason, message, strategy)
            return ok
        finally:
            # waiters see False when the first call failed or was cancelled, and try again next round
            del self._in_flight[pod.uid]
            fut.set_result(ok)

    async def _evict(self, pod: PodInfo, reason: str, message: str, strategy: str) -> bool:
        target = pod.key
        if not self._recording:
            why = "dry-run" if self.dry_run else "local mode: evictions are logged only"
            self.decisions.record(
                strategy, target, "evict", new=pod.uid, reason=f"{reason}: {message} ({why})", dry_run=True
            )
            self.evicted.add(pod.uid)
            EVICTION_PODS.inc(reason, "recorded", pod.namespace, pod.name)
            return True
        await self.limiter.acquire()
        error = await self._call(pod)
        ref = pod_reference(pod.namespace, pod.name, pod.uid)
        text = event_message(pod, reason, message)
        if error is None:
            self.backoff.succeeded(pod)
            self.evicted.add(pod.uid)
            EVICTION_PODS.inc(reason, "success", pod.namespace, pod.name)
            self.decisions.record(strategy, target, "evict", new=pod.uid, reason=f"{reason}: {message}")
            log.info("pod evicted", pod=target, uid=pod.uid, reason=reason, strategy=strategy)
            await self._event(ref, REASON_SUCCESS, text)
            return True
        EVICTION_PODS.inc(reason, "failed", pod.namespace, pod.name)
        retry_in = self.backoff.failed(pod)
        self.decisions.record(
            strategy, target, "evict-failed", new=pod.uid, reason=f"{reason}: {message}; error {error}"
        )
        log.warning(
            "eviction failed", pod=target, uid=pod.uid, reason=reason, error=error, retry_in_s=retry_in
        )
        await self._event(ref, REASON_FAIL, f"{text}, error {error}")
        return False

    async def _call(self, pod: PodInfo) -> str | None:
        """POST the Eviction; None on success, else the error text."""
        if self._client is None:
            return "no API client"
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": {"preconditions": {"uid": pod.uid}},
        }
        path = f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/pods/{quote(pod.name, safe='')}/eviction"
        try:
            client = await self._client()
            await client.request("POST", path, body=body)
        except ApiError as exc:
            if exc.status == 429:
                return f"too many requests (disruption budget): {exc.message or exc.reason}"
            if exc.status == 404:
                return f"pod not found: {exc.message or exc.reason}"
            if exc.status == 409:
                return f"conflict (UID precondition failed): {exc.message or exc.reason}"
            return str(exc)
        except KoordQoSError as exc:
            return str(exc)
        return None

    async def _event(self, ref: dict[str, str], reason: str, message: str) -> None:
        if self.recorder is not None:
            await self.recorder.record(ref, "Warning", reason, message)
