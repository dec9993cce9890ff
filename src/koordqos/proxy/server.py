"""ProxyServer: the RuntimeHookService on a unix socket, plus the registration file koord-runtime-proxy reads.

Socket hygiene: the parent directory is created; a stale socket (nobody accepting) is removed at start,
anything else at the path (a live server, a regular file) is refused; the socket is 0600 from the moment it
exists (mode set on the fd before bind, and again on the path); at exit it is removed, unless another
process has replaced it meanwhile. The registration file is written once the socket accepts calls and
re-checked every `refresh_interval` seconds. Connections write through `CorkedTransport`, so a unary
reply (HTTP/2 headers, message, trailers) leaves in one send (docs/performance.md, "Proxy mode").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, cast

import structlog
from grpclib.server import Server
from h2.connection import H2Connection
from h2.utilities import SizeLimitDict

from koordqos.errors import ConfigError, StartupError
from koordqos.once import SeenOnce
from koordqos.proxy import telemetry as m
from koordqos.proxy.registration import RegistrationFile
from koordqos.proxy.service import RuntimeHookService

log = structlog.get_logger("koordqos.proxy")

SOCKET_MODE = 0o600
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL
_LAYOUT_WARNED: SeenOnce[str] = SeenOnce()


def _is_live(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket at `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.2)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    else:
        return True
    finally:
        probe.close()


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def bind_socket(path: Path) -> socket.socket:
    """A listening-ready unix socket at `path` with mode 0600, replacing a stale socket (ConfigError else)."""
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        raise ConfigError(f"--runtime-hooks-addr {str(path)!r} is longer than {MAX_UNIX_PATH} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"--runtime-hooks-addr {str(path)!r} exists and is not a socket")
        if _is_live(path):
            raise ConfigError(f"another process serves {str(path)!r}; not taking it over")
        os.unlink(path)
        log.info("removed stale runtime hook socket", path=str(path))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Linux creates the socket file with the fd's mode: no window where the umask's mode is visible
        os.fchmod(sock.fileno(), SOCKET_MODE)
        sock.bind(str(path))
        os.chmod(path, SOCKET_MODE)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class CorkedTransport:
    """Wraps a transport: writes made during one event-loop step go out in one send.

    grpclib writes a unary reply as three HTTP/2 pieces (headers, message, trailers), each a separate
    `send()` that wakes the client process; corking them into one cuts the wakeups (and their context
    switches on a small node) to one per reply. Everything but write/close is the wrapped transport's.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._buffer: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue `data`; the queue is sent at the end of this loop step."""
        if not data:
            return
        if not self._buffer:
            self._loop.call_soon(self.flush)
        self._buffer.append(bytes(data))

    def flush(self) -> None:
        """Send what was queued."""
        if self._buffer:
            data = b"".join(self._buffer)
            self._buffer.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        """Flush, then close."""
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def corked(transport: asyncio.BaseTransport) -> asyncio.BaseTransport:
    """`transport` wrapped in a CorkedTransport when it can write.

    Duck-typed, not `isinstance(asyncio.Transport)`: uvloop's transports do not derive from asyncio's
    classes, and under uvloop (the default when installed) the check skipped corking altogether.
    """
    if callable(getattr(transport, "write", None)) and callable(getattr(transport, "is_closing", None)):
        return cast(asyncio.Transport, CorkedTransport(cast(asyncio.Transport, transport)))
    return transport


#: Closed streams an HTTP/2 connection remembers (h2 keeps 65,536 by default, ~135 bytes each: ~8.5 MiB per
#: long-lived connection, up to --runtime-hooks-max-connections of them). The memory only tells a late frame
#: on a just-closed stream from a protocol error; a unary server has at most its in-flight streams there.
CLOSED_STREAMS_KEPT = 1024


def bound_closed_streams(protocol: Any) -> None:
    """Make a grpclib connection's h2 state remember at most CLOSED_STREAMS_KEPT closed streams."""
    h2 = getattr(getattr(protocol, "connection", None), "_connection", None)
    if isinstance(h2, H2Connection) and isinstance(h2._closed_streams, SizeLimitDict):
        h2._closed_streams = SizeLimitDict(h2._closed_streams, size_limit=CLOSED_STREAMS_KEPT)
    elif _LAYOUT_WARNED.first("h2"):  # another grpclib/h2 layout: h2's own bound (65,536) still holds
        log.warning("cannot bound the HTTP/2 closed-stream memory: unexpected grpclib/h2 internals")


class _CorkedServer(Server):
    """grpclib Server whose connections write through a CorkedTransport, at most `max_connections` at once.

    A connection past the cap is closed as soon as it is accepted (counted, logged once per streak of
    refusals), so held-open connections cannot exhaust the agent's file descriptors; the server stays up.
    """

    def __init__(self, handlers: Any, max_connections: int = 0) -> None:
        super().__init__(handlers)
        self.max_connections = max_connections  # 0: no cap
        self.open_connections = 0
        self._refusing = False

    def _protocol_factory(self) -> Any:
        protocol = super()._protocol_factory()
        made = protocol.connection_made
        lost = protocol.connection_lost
        counted = False

        def connection_made(transport: asyncio.BaseTransport) -> None:
            nonlocal counted
            if self.max_connections and self.open_connections >= self.max_connections:
                m.REFUSED_CONNECTIONS.inc()
                if not self._refusing:
                    log.warning("runtime hook connection refused: too many open", limit=self.max_connections)
                self._refusing = True
                transport.close()
                return
            self._refusing = False
            counted = True
            self.open_connections += 1
            m.OPEN_CONNECTIONS.set(self.open_connections)
            made(corked(transport))
            bound_closed_streams(protocol)

        def connection_lost(exc: Exception | None) -> None:
            nonlocal counted
            if not counted:
                return  # refused: grpclib never saw it
            counted = False
            self.open_connections -= 1
            m.OPEN_CONNECTIONS.set(self.open_connections)
            lost(exc)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.connection_lost = connection_lost  # type: ignore[method-assign,assignment]
        return protocol


class ProxyServer:
    """Component: serves the RuntimeHookService until cancelled, then cleans up its socket."""

    name = "runtime-hooks-proxy"
    essential = False

    def __init__(
        self,
        service: RuntimeHookService,
        socket_path: Path,
        registration: RegistrationFile | None = None,
        refresh_interval: float = 10.0,
        status: MutableMapping[str, Any] | None = None,
        max_connections: int = 0,
    ) -> None:
        self.service = service
        self.max_connections = max_connections
        self.socket_path = Path(socket_path)
        self.registration = registration
        self.refresh_interval = refresh_interval
        self.status = status if status is not None else {}
        self.started = asyncio.Event()
        self._server: Server | None = None
        self._sock: socket.socket | None = None  # bound by `bind`, served by `start`
        self._identity: tuple[int, int, int] | None = None  # (dev, inode, ctime) of our socket file

    def bind(self) -> None:
        """Bind the socket (once; the agent does it before any component starts, so a path that is taken or
        unusable is a start-up error before anything acts: ConfigError or StartupError, exit 2). Calls are
        accepted from `start` on."""
        if self._sock is not None:
            return
        try:
            self._sock = bind_socket(self.socket_path)
        except OSError as exc:
            raise StartupError(f"--runtime-hooks-addr {self.socket_path}: {exc.strerror or exc}") from None
        self._identity = _identity(self.socket_path)

    def unbind(self) -> None:
        """Close a socket bound but never served, and remove it (the agent stops before serving)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
            self._remove_socket()

    async def start(self) -> None:
        """Bind the socket unless bound, start accepting calls; then write the registration file."""
        self.bind()
        sock, self._sock = self._sock, None
        assert sock is not None
        server = _CorkedServer([self.service], self.max_connections)
        try:
            await server.start(sock=sock)
        except BaseException:
            sock.close()
            self._remove_socket()
            raise
        self._server = server
        m.SERVING.set(1)
        self.status["proxy"] = "serving"
        log.info("runtime hook service listening", path=str(self.socket_path), policy=self.service.policy)
        if self.registration is not None:
            self.registration.sync()
        self.started.set()

    async def stop(self) -> None:
        """Stop accepting, cancel running calls, remove our socket."""
        server, self._server = self._server, None
        self.started.clear()
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._remove_socket()
        m.SERVING.set(0)
        self.status["proxy"] = "stopped"

    def _remove_socket(self) -> None:
        """Unlink the socket only if it is still ours (a successor may already have replaced it)."""
        try:
            # inode numbers are reused quickly: (dev, inode, ctime) tells a successor's socket apart
            if self._identity is not None and _identity(self.socket_path) == self._identity:
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove runtime hook socket", path=str(self.socket_path), error=str(exc))
        self._identity = None

    async def run(self) -> None:
        """Serve until cancelled; keep the registration file current meanwhile."""
        await self.start()
        try:
            while True:
                await asyncio.sleep(self.refresh_interval)
                if self.registration is not None:
                    self.registration.sync()
        finally:
            await self.stop()
