"""KubeClient: raw-dict HTTP access to the API server (aiohttp).

kubernetes-asyncio is used only to load a kubeconfig or the in-cluster service account (TLS material,
tokens, exec/auth-provider plugins and their refresh); requests are plain aiohttp calls returning dicts, so
no typed model is ever built (~1.5 ms per pod event saved on the shared loop).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from koordqos.errors import KubeError

log = structlog.get_logger("koordqos.kube.client")

AuthHeaders = Callable[[], Awaitable[dict[str, str]]]

SLICE_ITEMS = 64  # a list longer than this is encoded a slice at a time
SLICE_SECONDS = 0.002  # encoding yields to the event loop once a slice ran this long


async def encode_json(body: Any) -> bytes:
    """`json.dumps(body).encode()`, byte for byte, but a long list (a NodeMetric status's podsMetric: ~160 KB
    at 1,000 pods, 3–10 ms in one `json.dumps`) is encoded a slice of items at a time, yielding to the
    event loop between slices that ran `SLICE_SECONDS`."""
    parts: list[str] = []
    clock = [time.perf_counter()]
    await _encode_into(body, parts, clock)
    return "".join(parts).encode()


async def _encode_into(obj: Any, parts: list[str], clock: list[float]) -> None:
    if isinstance(obj, dict) and obj:
        parts.append("{")
        for i, (key, value) in enumerate(obj.items()):
            if i:
                parts.append(", ")
            parts.append(json.dumps(key) + ": ")
            await _encode_into(value, parts, clock)
        parts.append("}")
    elif isinstance(obj, list) and len(obj) > SLICE_ITEMS:
        parts.append("[")
        for start in range(0, len(obj), SLICE_ITEMS):
            if start:
                parts.append(", ")
            parts.append(json.dumps(obj[start : start + SLICE_ITEMS])[1:-1])
            if time.perf_counter() - clock[0] >= SLICE_SECONDS:
                await asyncio.sleep(0)
                clock[0] = time.perf_counter()
        parts.append("]")
    else:
        parts.append(json.dumps(obj))


class ApiError(KubeError):
    """A non-2xx answer from the API server, with the Status fields."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}: {message}".rstrip(": "))
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after: float | None = None  # seconds, from a 429/503 Retry-After header


@dataclass(frozen=True)
class ClientConfig:
    """Where and how to reach the API server."""

    host: str
    ssl: ssl.SSLContext | None = None
    auth: AuthHeaders | None = None


async def _no_auth() -> dict[str, str]:
    return {}


async def load_client_config(
    kubeconfig: str | None, in_cluster: bool = False, describe: str | None = None
) -> ClientConfig:
    """Read a kubeconfig (`:`-separated files are merged, as in KUBECONFIG) or the in-cluster service account
    via kubernetes-asyncio's loaders; KubeError with one line (`describe`: how the source is named in it)."""
    from kubernetes_asyncio import config as kconfig
    from kubernetes_asyncio.client import Configuration

    cfg = Configuration()
    try:
        if in_cluster:
            kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            await kconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    except Exception as exc:  # the loaders raise assorted types (ConfigException, OSError, yaml errors)
        where = describe or ("in-cluster config" if in_cluster else str(kubeconfig))
        reason = " ".join(str(exc).split()) or type(exc).__name__  # one line (yaml errors span several)
        raise KubeError(f"{where}: cannot load: {reason}") from exc
    host = str(cfg.host).rstrip("/")
    ctx: ssl.SSLContext | None = None
    if host.startswith("https://"):
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE

    async def auth() -> dict[str, str]:
        headers: dict[str, str] = {}
        settings = await cfg.auth_settings()
        for item in settings.values():
            if item.get("in") == "header" and item.get("value"):
                headers[str(item["key"])] = str(item["value"])
        if not headers and cfg.username:
            import base64

            raw = f"{cfg.username}:{cfg.password or ''}".encode()
            headers["authorization"] = "Basic " + base64.b64encode(raw).decode()
        return headers

    return ClientConfig(host=host, ssl=ctx, auth=auth)


class KubeClient:
    """Minimal API client: JSON requests and streaming watches, raw dicts in and out."""

    def __init__(
        self, config: ClientConfig, request_timeout: float = 30.0, user_agent: str = "koordqos"
    ) -> None:
        self.config = config
        self.request_timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None
        self._auth = config.auth or _no_auth
        self._headers = {"Accept": "application/json", "User-Agent": user_agent}

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self.config.ssl if self.config.ssl is not None else False,
                limit=16,
                enable_cleanup_closed=True,
            )
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One JSON call; raises ApiError on non-2xx, KubeError on transport failures.

        `content_type` selects the PATCH flavour (`application/merge-patch+json`)."""
        headers = await self._auth()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = await encode_json(body)
        try:
            async with self._sess().request(
                method,
                self.config.host + path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self.request_timeout),
            ) as resp:
                raw = await resp.read()
                if resp.status >= 300:
                    err = _api_error(resp.status, raw)
                    err.retry_after = _retry_after(resp.headers.get("Retry-After"))
                    raise err
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if not raw:
            return {}
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise KubeError(f"{method} {path}: invalid JSON response: {exc}") from None
        return doc if isinstance(doc, dict) else {"items": doc}

    async def stream(
        self,
        path: str,
        params: Mapping[str, str],
        read_timeout: float,
        connect_timeout: float = 10.0,
    ) -> AsyncGenerator[bytes, None]:
        """GET a streaming response, yield raw chunks; TimeoutError when silent for read_timeout s."""
        headers = await self._auth()
        try:
            async with self._sess().get(
                self.config.host + path,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=None),
            ) as resp:
                if resp.status >= 300:
                    raise _api_error(resp.status, await resp.read())
                while True:
                    async with asyncio.timeout(read_timeout):
                        chunk = await resp.content.readany()
                    if not chunk:
                        return
                    yield chunk
        except aiohttp.ClientError as exc:
            raise KubeError(f"watch {path}: {type(exc).__name__}: {exc}") from exc


def _api_error(status: int, raw: bytes) -> ApiError:
    reason = message = ""
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict):
            reason = str(doc.get("reason", ""))
            message = str(doc.get("message", ""))
    except ValueError:
        message = raw[:200].decode(errors="replace")
    return ApiError(status, reason, message)


def _retry_after(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        return None
