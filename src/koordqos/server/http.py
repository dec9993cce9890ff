"""HTTPServer: aiohttp app for health, readiness, Prometheus metrics and debug JSON."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from koordqos import loopwatch
from koordqos import observability as obs
from koordqos.errors import StartupError

if TYPE_CHECKING:
    from koordqos.config import ServerSettings
    from koordqos.decisions import DecisionLog
    from koordqos.state import NodeState

log = structlog.get_logger("koordqos.http")


class AgentView(Protocol):
    """What the endpoints show of the agent."""

    @property
    def ready(self) -> bool:
        """Pods, Node and NodeSLO sources have synced."""
        ...

    @property
    def local_mode(self) -> bool:
        """No cluster: pods from NRI, NodeSLO from a file."""
        ...

    @property
    def loop_lag(self) -> float:
        """Seconds the last loop-lag probe woke late."""
        ...

    @property
    def state(self) -> NodeState:
        """The newest NodeState."""
        ...

    @property
    def status(self) -> Mapping[str, Any]:
        """What components report (NRI connection, proxy, hooks, cgroups, QoS manager)."""
        ...

    @property
    def decisions(self) -> DecisionLog:
        """The decision log."""
        ...


class HTTPServer:
    """Serves the agent's endpoints on `--http-addr`."""

    name = "http"
    essential = True

    def __init__(self, settings: ServerSettings, view: AgentView) -> None:
        self.settings = settings
        self.view = view
        host, _, port = settings.http_addr.rpartition(":")
        self.host = host.strip("[]") or "0.0.0.0"
        self.port = int(port)
        self.bound_port: int | None = None
        self.app = self._make_app()
        self._runner: web.AppRunner | None = None

    def _make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        if self.settings.debug_endpoints:
            app.router.add_get("/debug/state", self.debug_state)
            app.router.add_get("/debug/decisions", self.debug_decisions)
            app.router.add_get("/debug/loop", self.debug_loop)
        return app

    async def bind(self) -> None:
        """Listen on `--http-addr` (once; the agent does it before any component starts, so a taken port is
        a start-up error before anything acts: StartupError, exit 2). Requests are answered from then on."""
        if self._runner is not None:
            return
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            # at start-up, not a crash to retry: the agent exits with this one line
            raise StartupError(f"--http-addr {self.settings.http_addr}: {exc.strerror or exc}") from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.bound_port = server.sockets[0].getsockname()[1]
        log.info("http listening", addr=f"{self.host}:{self.bound_port or self.port}")

    async def close(self) -> None:
        """Stop listening (a no-op when not bound)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def run(self) -> None:
        """Serve until cancelled (binding first unless the agent did)."""
        try:
            await self.bind()
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def healthz(self, request: web.Request) -> web.Response:
        """200 while the event loop answers (this handler running proves it)."""
        return web.json_response({"status": "ok", "loop_lag_ms": round(self.view.loop_lag * 1000, 3)})

    def _readiness(self) -> dict[str, Any]:
        state = self.view.state
        ready = self.view.ready
        obs.READY.set(1 if ready else 0)
        return {
            "ready": ready,
            "mode": "local" if self.view.local_mode else "cluster",
            "synced": sorted(state.synced),
            "nri_connected": state.nri_connected,
            **{k: v for k, v in self.view.status.items() if isinstance(v, str | int | float | bool)},
        }

    async def readyz(self, request: web.Request) -> web.Response:
        """200 once pods, Node and NodeSLO have synced; NRI state is reported but does not gate."""
        body = self._readiness()
        return web.json_response(body, status=200 if body["ready"] else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text format, rendered in a thread so a large registry never blocks the loop."""
        self._readiness()
        payload = await asyncio.to_thread(generate_latest, obs.REGISTRY)
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def debug_loop(self, request: web.Request) -> web.Response:
        """The slow-step detector (`KOORDQOS_LOOP_WATCH=1`): step histogram, longest step, slow steps
        that ended at or after `?since=` (a time.monotonic value); 404 when the detector is off."""
        watch = loopwatch.current()
        if watch is None:
            return web.json_response({"error": f"slow-step detector off (set {loopwatch.ENV}=1)"}, status=404)
        try:
            since = float(request.query.get("since", "0"))
        except ValueError:
            return web.json_response({"error": "since: not a number"}, status=400)
        return web.json_response(watch.snapshot(since))

    async def debug_state(self, request: web.Request) -> web.Response:
        """NodeState as JSON: pods with QoS class, NodeSLO in force, NRI state, last metrics."""
        state = self.view.state
        tick = state.last_tick
        sample = getattr(tick, "sample", None) if tick else None
        body = {
            "generation": state.generation,
            "synced": sorted(state.synced),
            "nri_connected": state.nri_connected,
            "node": state.node.model_dump(mode="json") if state.node else None,
            "node_slo": state.node_slo.model_dump(mode="json") if state.node_slo else None,
            "pods": [
                {
                    "uid": p.uid,
                    "namespace": p.namespace,
                    "name": p.name,
                    "qos": str(p.qos),
                    "kube_qos": str(p.kube_qos),
                    "priority_class": str(p.priority_class),
                    "phase": p.phase,
                    "source": p.source,
                }
                for p in state.pods.values()
            ],
            "runtime": {"sandboxes": len(state.sandboxes), "containers": len(state.containers)},
            "last_tick": {"at": tick.at, "age_s": round(time.time() - tick.at, 3)} if tick else None,
            "last_metrics": _jsonable(sample),
            "status": _jsonable(self.view.status),
        }
        return web.json_response(body, dumps=_dumps)

    async def debug_decisions(self, request: web.Request) -> web.Response:
        """Recent decisions, newest last (`?limit=N&strategy=S`)."""
        try:
            limit = int(request.query.get("limit", "500"))
        except ValueError:
            raise web.HTTPBadRequest(text="limit must be an integer") from None
        items = self.view.decisions.recent(limit, request.query.get("strategy"))
        return web.json_response([d.as_dict() for d in items], dumps=_dumps)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    as_dict = getattr(value, "as_dict", None)
    if callable(as_dict):
        return _jsonable(as_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # metric samples are slotted dataclasses: their fields, not their repr (a Python string)
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, Mapping):  # also the read-only MappingProxyType views samples hold
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return repr(value)


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, default=repr)
