"""A recording reverse proxy between the agent and the API server (plain HTTP in, HTTPS out).

It forwards every request unchanged (watch streams included, chunk by chunk) and keeps, for each write
(POST/PUT/PATCH), the body the agent sent and the `Warning` headers the server answered with: the real
server warns for every unknown field it prunes, so a field the CRD does not know shows up here.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


@dataclass
class Write:
    """One write request the agent made, and the answer."""

    method: str
    path: str
    body: Any
    status: int
    warnings: list[str]
    response: Any


@dataclass
class RecordingProxy:
    """Listens on 127.0.0.1:<port>; `writes` fills as the agent writes."""

    upstream: str
    ssl_context: ssl.SSLContext
    writes: list[Write] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def writes_to(self, path_part: str) -> list[Write]:
        with self._lock:
            return [w for w in self.writes if path_part in w.path]

    def start(self) -> None:
        proxy = self
        target = urlsplit(self.upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPSConnection(
                    target.hostname or "127.0.0.1", target.port, context=proxy.ssl_context, timeout=600
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                captured = bytearray()
                try:
                    while chunk := resp.read1(65536):
                        if self.command != "GET":
                            captured += chunk
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    # recorded before the last chunk goes out: a client with its answer finds its write here
                    self._record(body, resp, bytes(captured))
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError, http.client.IncompleteRead):
                    # the agent or the server cut a stream (a watch at shutdown): nothing to record or finish
                    self.close_connection = True
                finally:
                    conn.close()

            def _record(self, body: bytes | None, resp: http.client.HTTPResponse, captured: bytes) -> None:
                if self.command not in {"POST", "PUT", "PATCH"}:
                    return
                write = Write(
                    self.command,
                    self.path,
                    _json(body),
                    resp.status,
                    [v for k, v in resp.getheaders() if k.lower() == "warning"],
                    _json(captured),
                )
                with proxy._lock:
                    proxy.writes.append(write)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _json(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
