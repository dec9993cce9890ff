"""A fake Kubernetes API server for tests: real HTTP (aiohttp) on 127.0.0.1, speaking the real wire format.

Served: pods (namespaced), nodes, NodeSLOs and NodeMetrics (`slo.koordinator.sh/v1alpha1`),
NodeResourceTopologies (`topology.node.k8s.io/v1alpha1`; all cluster scoped) and events:
* list with `resourceVersion`, `limit`/`continue` pagination and `fieldSelector` (`a=b`, `a!=b`, comma = AND;
  `metadata.name`, `metadata.namespace`, `spec.nodeName`, any dotted path);
* watch (`?watch=true`) from a resourceVersion: replays history newer than it, then streams ADDED / MODIFIED /
  DELETED, BOOKMARK (when `allowWatchBookmarks`, every `bookmark_interval` s or on `send_bookmark()`), an
  ERROR event with a 410 Status when the version was compacted away, and ends after `timeoutSeconds`;
* `POST .../pods/{name}/eviction` → 201 (pod deleted), 429 when a PodDisruptionBudget blocks it
  (`block_eviction`), 404 when absent, 409 when the UID precondition does not match;
* `POST /api/v1/namespaces/{ns}/events` → 201, kept in `events`;
* GET/PUT/DELETE of single objects, POST to create (409 AlreadyExists), JSON merge-PATCH; a PUT or PATCH
  whose `metadata.resourceVersion` is not the stored one → 409 Conflict; PUT of an absent object → 404;
* the `status` subresource of pods, nodes and NodeMetrics: a write to the main resource keeps the stored
  status, a write to `/status` changes only the status.

Test controls: `upsert`, `delete`, `compact`, `drop_watches` (abort every open watch connection),
`stall_watches` (open watches stop receiving anything, connections stay up), `restart` (stop, optionally lose
history, start on the same port), `fail_next` (answer the next N requests matching a path with an error),
`clear_failures`, `write_kubeconfig`. Optional bearer-token auth. Set `port` before the first `start` to have
a kubeconfig point at a server that is not up yet (connections refused until it starts).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.fake_objects import make_node, make_nodemetric, make_nodeslo, make_pod

NODESLO_GROUP_PATH = "/apis/slo.koordinator.sh/v1alpha1"
GROUP_PATHS = (
    "/apis/slo.koordinator.sh/v1alpha1",
    "/apis/topology.node.k8s.io/v1alpha1",
    "/apis/scheduling.koordinator.sh/v1alpha1",
)
__all__ = ["KINDS", "FakeAPIServer", "Kind", "make_node", "make_nodemetric", "make_nodeslo", "make_pod"]


@dataclass(frozen=True)
class Kind:
    """One served resource type."""

    plural: str
    kind: str
    api_version: str
    namespaced: bool
    status_subresource: bool = False


KINDS = {
    "pods": Kind("pods", "Pod", "v1", True, True),
    "nodes": Kind("nodes", "Node", "v1", False, True),
    "nodeslos": Kind("nodeslos", "NodeSLO", "slo.koordinator.sh/v1alpha1", False),
    "nodemetrics": Kind("nodemetrics", "NodeMetric", "slo.koordinator.sh/v1alpha1", False, True),
    "noderesourcetopologies": Kind(
        "noderesourcetopologies", "NodeResourceTopology", "topology.node.k8s.io/v1alpha1", False
    ),
    "devices": Kind("devices", "Device", "scheduling.koordinator.sh/v1alpha1", False),
    "persistentvolumeclaims": Kind("persistentvolumeclaims", "PersistentVolumeClaim", "v1", True),
    "events": Kind("events", "Event", "v1", True),
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes a key, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass
class _Watcher:
    plural: str
    selector: list[tuple[str, str, bool]]
    namespace: str | None
    queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=asyncio.Queue)
    request: web.Request | None = None
    stalled: bool = False
    bookmarks: bool = False


@dataclass
class _Failure:
    path_contains: str
    status: int
    remaining: int
    method: str | None = None
    retry_after: int | None = None


def _parse_selector(text: str) -> list[tuple[str, str, bool]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            out.append((key.strip(), value.strip(), False))
        else:
            key, _, value = part.partition("=")
            out.append((key.strip().rstrip("="), value.strip().lstrip("="), True))
    return out


def _field(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


def _matches(obj: dict[str, Any], selector: list[tuple[str, str, bool]], namespace: str | None) -> bool:
    if namespace is not None and _field(obj, "metadata.namespace") != namespace:
        return False
    return all((_field(obj, key) == value) == eq for key, value, eq in selector)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeAPIServer:
    """In-memory API server; `await start()`, point a kubeconfig at `url`, `await stop()`."""

    def __init__(self, token: str | None = "test-token", bookmark_interval: float | None = None) -> None:
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in KINDS}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, plural, type, object)
        self.rv = 100
        self.compacted_rv = 0
        self.events: list[dict[str, Any]] = []
        self.evictions: list[dict[str, Any]] = []  # every eviction request: {namespace, name, uid, status}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.pdb_blocked: set[tuple[str, str]] = set()
        self.watchers: list[_Watcher] = []
        self.port = 0
        self._failures: list[_Failure] = []
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._snapshots: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._tokens = itertools.count(1)
        self.watch_opened = 0

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """http://127.0.0.1:<port>."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on 127.0.0.1 (port 0 the first time, the same port after a restart)."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Close every connection and stop listening."""
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, lose_history: bool = False) -> None:
        """Stop and start again on the same port; `lose_history` compacts everything (watches get 410)."""
        await self.stop()
        if lose_history:
            self.compact()
        await self.start()

    def write_kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig pointing at this server (bearer token auth)."""
        user: dict[str, Any] = {"token": token if token is not None else (self.token or "none")}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(doc))
        return path

    # -- test controls -----------------------------------------------------------------------------------

    def upsert(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (ADDED or MODIFIED); returns the stored copy."""
        kind = KINDS[plural]
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", "") if kind.namespaced else "", meta["name"])
        old = self.objects[plural].get(key)
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.objects[plural][key] = obj
        self._emit(plural, "MODIFIED" if old else "ADDED", obj)
        return copy.deepcopy(obj)

    def delete(self, plural: str, name: str, namespace: str = "default") -> bool:
        """Delete an object (DELETED event); False when absent."""
        key = (namespace if KINDS[plural].namespaced else "", name)
        obj = self.objects[plural].pop(key, None)
        if obj is None:
            return False
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(plural, "DELETED", obj)
        return True

    def get(self, plural: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """The stored object, or None."""
        key = (namespace if KINDS[plural].namespaced else "", name)
        obj = self.objects[plural].get(key)
        return copy.deepcopy(obj) if obj is not None else None

    def compact(self) -> None:
        """Forget history up to now: watches from an older resourceVersion get 410 Gone."""
        self.compacted_rv = self.rv
        self.history.clear()
        self._snapshots.clear()

    def drop_watches(self) -> None:
        """Abort every open watch connection (as a broken network or a restarting server would)."""
        for w in list(self.watchers):
            w.queue.put_nowait(None)

    def stall_watches(self) -> None:
        """Open watches receive nothing from now on (connections stay up); new watches work normally."""
        for w in self.watchers:
            w.stalled = True

    def send_bookmark(self) -> None:
        """Send a BOOKMARK at the current resourceVersion to every watch that asked for bookmarks."""
        for w in self.watchers:
            if w.bookmarks and not w.stalled:
                w.queue.put_nowait(("BOOKMARK", self._bookmark_obj(w.plural)))

    def block_eviction(self, namespace: str, name: str, blocked: bool = True) -> None:
        """A PodDisruptionBudget forbids (or again allows) evicting this pod: 429."""
        if blocked:
            self.pdb_blocked.add((namespace, name))
        else:
            self.pdb_blocked.discard((namespace, name))

    def fail_next(
        self,
        path_contains: str,
        status: int = 500,
        times: int = 1,
        method: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next `times` requests whose path contains `path_contains` with `status`."""
        self._failures.append(_Failure(path_contains, status, times, method, retry_after))

    def clear_failures(self) -> None:
        """Answer normally again (the injected failures still pending are dropped)."""
        self._failures.clear()

    def count_requests(self, predicate: Callable[[str, str, dict[str, str]], bool]) -> int:
        """How many logged requests match."""
        return sum(1 for m, p, q in self.requests if predicate(m, p, q))

    # -- internals ---------------------------------------------------------------------------------------

    def _emit(self, plural: str, etype: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, plural, etype, copy.deepcopy(obj)))
        for w in self.watchers:
            if w.plural == plural and not w.stalled and _matches(obj, w.selector, w.namespace):
                w.queue.put_nowait((etype, copy.deepcopy(obj)))

    def _bookmark_obj(self, plural: str) -> dict[str, Any]:
        kind = KINDS[plural]
        return {
            "kind": kind.kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
        }

    def _route(self, path: str) -> tuple[str, str | None, str | None, str | None] | None:
        """path → (plural, namespace, name, subresource)."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            rest = parts[2:]
        elif "/" + "/".join(parts[:3]) in GROUP_PATHS:
            rest = parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in KINDS:
            return None
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return plural, namespace, name, sub

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.method, request.path, query))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        for f in self._failures:
            if f.remaining > 0 and f.path_contains in request.path and f.method in (None, request.method):
                f.remaining -= 1
                reason = {409: "Conflict", 429: "TooManyRequests"}.get(f.status, "InternalError")
                headers = {"Retry-After": str(f.retry_after)} if f.retry_after is not None else None
                return web.json_response(
                    _status(f.status, reason, "injected failure"), status=f.status, headers=headers
                )
        route = self._route(request.path)
        if route is None:
            return web.json_response(
                _status(404, "NotFound", f"the server could not find {request.path}"), status=404
            )
        plural, namespace, name, sub = route
        kind = KINDS[plural]
        if request.method == "GET" and name is None:
            if query.get("watch") in ("true", "1"):
                return await self._watch(request, plural, namespace, query)
            return self._list(plural, namespace, query)
        if request.method == "POST" and plural == "pods" and sub == "eviction" and name:
            return await self._evict(request, namespace or "default", name)
        if request.method == "POST" and plural == "events":
            body = await request.json()
            body.setdefault("metadata", {}).setdefault("namespace", namespace or "default")
            self.events.append(body)
            stored = self.upsert("events", body)
            return web.json_response(stored, status=201)
        key = (namespace or "default" if kind.namespaced else "", name or "")
        if request.method == "GET":
            obj = self.objects[plural].get(key)
            if obj is None:
                return web.json_response(_status(404, "NotFound", f'{plural} "{name}" not found'), status=404)
            return web.json_response(obj)
        if request.method in ("PUT", "POST", "PATCH"):
            return await self._write(request, plural, key, sub)
        if request.method == "DELETE" and name:
            if not self.delete(plural, name, namespace or "default"):
                return web.json_response(_status(404, "NotFound", f'{plural} "{name}" not found'), status=404)
            return web.json_response(_status(200, "", ""))
        return web.json_response(_status(405, "MethodNotAllowed", "method not allowed"), status=405)

    async def _write(
        self, request: web.Request, plural: str, key: tuple[str, str], sub: str | None
    ) -> web.Response:
        """POST (create), PUT (replace) and merge-PATCH with resourceVersion and status-subresource rules."""
        kind = KINDS[plural]
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(_status(400, "BadRequest", "invalid JSON body"), status=400)
        if not isinstance(body, dict):
            return web.json_response(_status(400, "BadRequest", "expected a JSON object"), status=400)
        stored = self.objects[plural].get(key)
        name = key[1] or str((body.get("metadata") or {}).get("name", ""))
        if request.method == "POST":
            if sub is not None:
                return web.json_response(
                    _status(405, "MethodNotAllowed", "cannot create a subresource"), status=405
                )
            if self.objects[plural].get((key[0], name)) is not None:
                msg = f'{plural} "{name}" already exists'
                return web.json_response(_status(409, "AlreadyExists", msg), status=409)
            created = self.upsert(plural, body)
            return web.json_response(created, status=201)
        if stored is None:
            return web.json_response(_status(404, "NotFound", f'{plural} "{name}" not found'), status=404)
        if sub not in (None, "status") or (sub == "status" and not kind.status_subresource):
            return web.json_response(_status(404, "NotFound", f"no subresource {sub!r}"), status=404)
        if request.method == "PATCH":
            body = merge_patch(stored, body)
        want_rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        current_rv = str(stored["metadata"].get("resourceVersion", ""))
        if want_rv and want_rv != current_rv:
            msg = (
                f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again"
            )
            return web.json_response(_status(409, "Conflict", msg), status=409)
        new = copy.deepcopy(stored)
        if sub == "status":
            new["status"] = copy.deepcopy(body.get("status"))
            if new["status"] is None:
                del new["status"]
        else:
            new = copy.deepcopy(body)
            new["metadata"] = {**body.get("metadata", {}), "uid": stored["metadata"].get("uid")}
            new["metadata"].pop("resourceVersion", None)
            if kind.status_subresource:  # the main resource cannot change the status
                new.pop("status", None)
                if "status" in stored:
                    new["status"] = copy.deepcopy(stored["status"])
        same = copy.deepcopy(stored)
        same["metadata"].pop("resourceVersion", None)
        if new == same:  # a no-op write does not bump the resourceVersion
            return web.json_response(copy.deepcopy(stored))
        return web.json_response(self.upsert(plural, new))

    def _list(self, plural: str, namespace: str | None, query: dict[str, str]) -> web.Response:
        kind = KINDS[plural]
        token = query.get("continue", "")
        if token:
            snap = self._snapshots.get(token)
            if snap is None:
                return web.json_response(_status(410, "Expired", "continue token expired"), status=410)
            rv, items = snap
        else:
            selector = _parse_selector(query.get("fieldSelector", ""))
            items = [
                copy.deepcopy(o)
                for _, o in sorted(self.objects[plural].items())
                if _matches(o, selector, namespace)
            ]
            rv = self.rv
        limit = int(query.get("limit", "0") or 0)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and len(items) > limit:
            page, rest = items[:limit], items[limit:]
            new_token = f"c{next(self._tokens)}"
            self._snapshots[new_token] = (rv, rest)
            meta["continue"] = new_token
            items = page
        return web.json_response(
            {"kind": kind.kind + "List", "apiVersion": kind.api_version, "metadata": meta, "items": items}
        )

    async def _watch(
        self, request: web.Request, plural: str, namespace: str | None, query: dict[str, str]
    ) -> web.StreamResponse:
        selector = _parse_selector(query.get("fieldSelector", ""))
        since = int(query.get("resourceVersion") or 0)
        timeout = float(query.get("timeoutSeconds") or 0) or None
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        watcher = _Watcher(
            plural, selector, namespace, request=request, bookmarks=query.get("allowWatchBookmarks") == "true"
        )
        self.watch_opened += 1

        async def send(etype: str, obj: dict[str, Any]) -> None:
            await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

        if since and since < self.compacted_rv:
            msg = f"too old resource version: {since} ({self.compacted_rv})"
            await send("ERROR", _status(410, "Expired", msg))
            await resp.write_eof()
            return resp
        if since:
            backlog = [
                (t, o)
                for rv, p, t, o in self.history
                if p == plural and rv > since and _matches(o, selector, namespace)
            ]
        else:  # no version: synthetic ADDED events for what exists now, as the real server does
            backlog = [
                ("ADDED", o)
                for _, o in sorted(self.objects[plural].items())
                if _matches(o, selector, namespace)
            ]
        self.watchers.append(watcher)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout if timeout else None
        try:
            for etype, obj in backlog:
                await send(etype, copy.deepcopy(obj))
            while True:
                wait = None if end is None else end - loop.time()
                if self.bookmark_interval and watcher.bookmarks:
                    wait = self.bookmark_interval if wait is None else min(wait, self.bookmark_interval)
                if wait is not None and wait <= 0:
                    break
                try:
                    # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a cancellation that races an
                    # item arriving, and the watch handler would then outlive the server's shutdown
                    async with asyncio.timeout(wait):
                        item = await watcher.queue.get()
                except TimeoutError:
                    if end is not None and loop.time() >= end:
                        break
                    if not watcher.stalled:
                        await send("BOOKMARK", self._bookmark_obj(plural))
                    continue
                if item is None:  # dropped: abort the connection without a clean end
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if not watcher.stalled:
                    await send(*item)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            if watcher in self.watchers:
                self.watchers.remove(watcher)
        return resp

    async def _evict(self, request: web.Request, namespace: str, name: str) -> web.Response:
        body = await request.json()
        uid = (((body.get("deleteOptions") or {}).get("preconditions")) or {}).get("uid")
        pod = self.objects["pods"].get((namespace, name))
        record = {"namespace": namespace, "name": name, "uid": uid, "body": body}
        self.evictions.append(record)
        if pod is None:
            record["status"] = 404
            return web.json_response(_status(404, "NotFound", f'pods "{name}" not found'), status=404)
        if uid and pod["metadata"]["uid"] != uid:
            record["status"] = 409
            return web.json_response(
                _status(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {uid}, "
                    f"UID in object meta: {pod['metadata']['uid']}",
                ),
                status=409,
            )
        if (namespace, name) in self.pdb_blocked:
            record["status"] = 429
            return web.json_response(
                _status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                ),
                status=429,
            )
        record["status"] = 201
        self.delete("pods", name, namespace)
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, status=201
        )
