"""Reflector: list + watch one kind of object and hand raw dicts to a handler.

Behaviour (client-go's reflector, made explicit):
* list (paginated, `limit` per page so no single JSON decode stalls the loop) → `handler.on_list(items)`;
  then watch from the list's resourceVersion with `allowWatchBookmarks`;
* every event and bookmark advances the resourceVersion; a watch that ends (server timeout, dropped
  connection) is re-opened from it;
* 410 Gone (an ERROR event or an HTTP 410) → re-list; the handler reconciles, so deletions that happened
  while away are detected;
* a connection silent for `read_timeout` seconds is abandoned and re-opened (counted);
* errors back off exponentially with jitter, capped; a successful list resets the backoff;
* every `resync_seconds` the reflector re-lists even if nothing went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.errors import KoordQoSError, ProtocolError
from koordqos.kube.backoff import Backoff
from koordqos.kube.client import ApiError, KubeClient
from koordqos.kube.watch import WatchDecoder, WatchEvent

log = structlog.get_logger("koordqos.kube.reflector")

LISTS = Counter(
    "koordqos_kube_lists_total",
    "Full lists by resource and cause",
    ["resource", "cause"],
    registry=obs.REGISTRY,
)
WATCHES = Counter(
    "koordqos_kube_watch_ends_total",
    "Watch streams that ended, by resource and cause",
    ["resource", "cause"],
    registry=obs.REGISTRY,
)
WATCH_EVENTS = Counter(
    "koordqos_kube_watch_events_total",
    "Watch events received by resource and type",
    ["resource", "type"],
    registry=obs.REGISTRY,
)


class ReflectorHandler(Protocol):
    """What a reflector feeds: a full list, single events, and "the resource type does not exist"."""

    async def on_list(self, items: list[dict[str, Any]]) -> None: ...

    async def on_event(self, event: WatchEvent) -> None: ...

    async def on_absent(self) -> None: ...


@dataclass
class ReflectorSettings:
    """Timeouts and periods of one reflector."""

    resync_seconds: float = 300.0
    watch_timeout_seconds: float = 240.0
    read_timeout_seconds: float = 330.0
    page_size: int = 100
    backoff_base: float = 0.5
    backoff_cap: float = 30.0


class _Expired(Exception):
    """The resourceVersion is too old: re-list."""


class Reflector:
    """List + watch of `path` (optionally filtered by a field selector), feeding `handler`."""

    def __init__(
        self,
        resource: str,
        client: Callable[[], Awaitable[KubeClient]],
        path: str,
        handler: ReflectorHandler,
        field_selector: str = "",
        settings: ReflectorSettings | None = None,
    ) -> None:
        self.resource = resource
        self.name = f"kube-{resource}"
        self.essential = False
        self._client = client
        self.path = path
        self.handler = handler
        self.field_selector = field_selector
        self.settings = settings or ReflectorSettings()
        self.backoff = Backoff(self.settings.backoff_base, self.settings.backoff_cap)
        self.resource_version = ""
        self.lists = 0
        self.watch_ends: dict[str, int] = {}
        self.synced = asyncio.Event()

    async def run(self) -> None:
        """List and watch forever (until cancelled)."""
        need_list = True
        list_cause = "initial"
        last_list = 0.0
        while True:
            try:
                client = await self._client()
                if need_list:
                    await self._list(client, list_cause)
                    last_list = time.monotonic()
                    need_list = False
                    self.backoff.reset()
                deadline = last_list + self.settings.resync_seconds
                cause = await self._watch(client, deadline)
                self._count_end(cause)
                if cause == "resync":
                    need_list, list_cause = True, "resync"
            except _Expired:
                self._count_end("expired")
                log.info(
                    "resourceVersion expired; re-listing",
                    resource=self.resource,
                    resource_version=self.resource_version,
                )
                need_list, list_cause = True, "expired"
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.status == 404 and need_list:
                    log.info("resource type not served; using the handler's default", resource=self.resource)
                    await self.handler.on_absent()
                    self.synced.set()
                await self._failed(exc, "api")
            except (KoordQoSError, OSError) as exc:
                await self._failed(exc, "connection")

    async def _failed(self, exc: Exception, kind: str) -> None:
        delay = self.backoff.next_delay()
        self._count_end(kind)
        obs.ERRORS.labels(self.name, kind).inc()
        log.warning(
            "list/watch failed; backing off",
            resource=self.resource,
            error=str(exc),
            attempt=self.backoff.failures,
            retry_in_s=round(delay, 3),
        )
        await asyncio.sleep(delay)

    def _count_end(self, cause: str) -> None:
        WATCHES.labels(self.resource, cause).inc()
        self.watch_ends[cause] = self.watch_ends.get(cause, 0) + 1

    def _params(self) -> dict[str, str]:
        return {"fieldSelector": self.field_selector} if self.field_selector else {}

    async def _list(self, client: KubeClient, cause: str) -> None:
        items: list[dict[str, Any]] = []
        token = ""
        rv = ""
        while True:
            params = self._params()
            params["limit"] = str(self.settings.page_size)
            if token:
                params["continue"] = token
            try:
                doc = await client.request("GET", self.path, params)
            except ApiError as exc:
                if exc.status == 410 and token:
                    # the continue token expired mid-list: start over
                    items, token = [], ""
                    continue
                raise
            page = doc.get("items") or []
            if not isinstance(page, list):
                raise ProtocolError(f"list {self.path}: items is not a list")
            items.extend(i for i in page if isinstance(i, dict))
            meta = doc.get("metadata") or {}
            rv = str(meta.get("resourceVersion", "")) or rv
            token = str(meta.get("continue") or "")
            if not token:
                break
            await asyncio.sleep(0)  # let the loop breathe between pages
        self.resource_version = rv
        self.lists += 1
        LISTS.labels(self.resource, cause).inc()
        log.debug("listed", resource=self.resource, items=len(items), resource_version=rv, cause=cause)
        await self.handler.on_list(items)
        self.synced.set()

    async def _watch(self, client: KubeClient, deadline: float) -> str:
        """Watch until the stream ends; returns why ("closed", "silent", "resync"); raises _Expired."""
        params = self._params()
        params.update(
            {
                "watch": "true",
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": "true",
                # spread re-connects of many agents over time (client-go does the same)
                "timeoutSeconds": str(
                    int(self.settings.watch_timeout_seconds * random.uniform(1.0, 1.25)) or 1
                ),
            }
        )
        decoder = WatchDecoder()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "resync"
        resync = asyncio.timeout(remaining)
        try:
            async with resync:
                stream = client.stream(self.path, params, self.settings.read_timeout_seconds)
                async with contextlib.aclosing(stream) as chunks:
                    async for chunk in chunks:
                        for event in decoder.feed(chunk):
                            await self._dispatch(event)
                    for event in decoder.close():
                        await self._dispatch(event)
        except TimeoutError:
            if resync.expired():
                return "resync"
            log.info(
                "watch connection silent; reconnecting",
                resource=self.resource,
                read_timeout_s=self.settings.read_timeout_seconds,
            )
            return "silent"
        except ApiError as exc:
            if exc.status == 410:
                raise _Expired() from None
            raise
        return "closed"

    async def _dispatch(self, event: WatchEvent) -> None:
        WATCH_EVENTS.labels(self.resource, event.type).inc()
        if event.type == "ERROR":
            if event.status_code == 410:
                raise _Expired()
            raise ApiError(
                event.status_code or 500,
                str(event.object.get("reason", "")),
                str(event.object.get("message", "")),
            )
        rv = event.resource_version
        if event.type != "BOOKMARK":
            await self.handler.on_event(event)
        if rv:
            self.resource_version = rv
