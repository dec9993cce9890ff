"""The real koordlet (Koordinator KOORDINATOR_VERSION) on a synthetic node, against the suite's API server.

koordlet takes its pods from the kubelet's `/pods/`, not from the API server: `FakeKubelet` serves a PodList
of the pods it is given on plain HTTP (koordlet's `--kubelet-insecure-tls`: the kubelet's read-only port), on
the address the Node reports (`status.addresses` InternalIP 127.0.0.1, `daemonEndpoints.kubeletEndpoint`).
Everything else koordlet reads or writes on the host is pointed into the synthetic node or a work dir of its
own (`koordlet_argv`). What cannot run here is switched off, and said so in `DISABLED`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from koordqos.testing.nodefs import SyntheticNode
from tests.support.agentproc import free_port

from .controlplane import Api, ControlPlane
from .koordinator import binary

KOORDLET = Path(os.environ.get("KOORDQOS_KOORDLET", str(binary("koordlet"))))

#: What the koordlet here does not run, and why (the rest of its defaults are left as they are).
DISABLED = {
    "--enable-nri-runtime-hook=false": "no NRI runtime here (koordqos runs with --enable-nri=false alike)",
    "--disable-query-kubelet-config=true": "the fake kubelet has no /configz (required with insecure TLS)",
    "--kubelet-insecure-tls=true": "the fake kubelet is plain HTTP on its read-only port, no authentication",
}


_LIST_HEAD = b'{"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": ['


class FakeKubelet:
    """`GET /pods/` → a PodList of the pods it holds (each pod encoded once; the list joined on the first
    request after a change, so that a change costs no encoding of the whole list)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._pods: dict[str, bytes] = {}  # encoded, by uid, in insertion order
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self.requests = 0
        self.abandoned = 0  # answers the client hung up on before the end
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/pods":
                    self.send_error(404)
                    return
                with kubelet._lock:
                    if kubelet._body is None:
                        kubelet._body = _LIST_HEAD + b",".join(kubelet._pods.values()) + b"]}"
                    body = kubelet._body
                    kubelet.requests += 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # koordlet gave up (--kubelet-sync-timeout)
                    with kubelet._lock:
                        kubelet.abandoned += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kubelet", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> FakeKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def set_pods(self, pods: Iterable[dict[str, Any]]) -> None:
        encoded = {p["metadata"]["uid"]: json.dumps(p).encode() for p in pods}
        with self._lock:
            self._pods = encoded
            self._body = None

    def update(self, add: Iterable[dict[str, Any]] = (), remove: Iterable[str] = ()) -> None:
        """Add pods and remove pods by uid, in one change of the served list."""
        encoded = [(p["metadata"]["uid"], json.dumps(p).encode()) for p in add]
        with self._lock:
            self._pods.update(encoded)
            for uid in remove:
                self._pods.pop(uid, None)
            self._body = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)


def prepare_node(node: SyntheticNode, memory_total: int) -> None:
    """What koordlet reads besides SyntheticNode's files: /proc/cpuinfo and /proc/cmdline (its resctrl
    checks, several times a second, log an error per read when they are missing) and NUMA node 0 with every
    CPU (its NodeResourceTopology). No `rdt_a`/`cat_l3` flag: resctrl is unsupported, as on this machine."""
    cpuinfo = "".join(
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\nphysical id\t: 0\ncore id\t\t: {i // 2}\n"
        "flags\t\t: fpu sse sse2 ht\n\n"
        for i in range(node.cpus)
    )
    node.proc_root.mkdir(parents=True, exist_ok=True)
    (node.proc_root / "cpuinfo").write_text(cpuinfo)
    (node.proc_root / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro\n")  # no rdt=: as here
    node.set_numa(0, range(node.cpus), {"MemTotal": memory_total, "MemFree": memory_total // 2})


def create_kubelet_node(api: Api, name: str, kubelet_port: int, cpu: str, memory: str) -> dict[str, Any]:
    """A Ready Node whose kubelet is at 127.0.0.1:`kubelet_port` (what koordlet connects to)."""
    res = {"cpu": cpu, "memory": memory, "pods": "5000"}
    node = api.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    node["status"] = {
        "capacity": dict(res),
        "allocatable": dict(res),
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}],
    }
    return dict(api.put(f"/api/v1/nodes/{name}/status", node))


def koordlet_argv(
    node: SyntheticNode, workdir: Path, kubelet_port: int, metrics_port: int, *extra: str
) -> list[str]:
    """koordlet on `node` (v1 cgroupfs, as SyntheticNode's default), state under `workdir`."""
    dirs = {name: workdir / name for name in ("var-run", "run", "var-lib-kubelet", "hooks", "tsdb", "audit")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    (node.sys_root / "fs").mkdir(parents=True, exist_ok=True)
    return [
        str(KOORDLET),
        f"--cgroup-root-dir={node.cgroup_root}",
        f"--proc-root-dir={node.proc_root}",
        f"--sys-root-dir={node.sys_root}",
        f"--sys-fs-root-dir={node.sys_root / 'fs'}",
        f"--var-run-root-dir={dirs['var-run']}",
        f"--run-root-dir={dirs['run']}",
        f"--var-lib-kubelet-dir={dirs['var-lib-kubelet']}",
        f"--runtime-hooks-config-path={dirs['hooks']}",
        f"--runtime-hooks-addr={workdir / 'koordlet.sock'}",
        f"--tsdb-path={dirs['tsdb']}",
        f"--audit-log-dir={dirs['audit']}",
        f"--prediction-checkpoint-filepath={workdir / 'prediction-checkpoints'}",
        f"--kubelet-read-only-port={kubelet_port}",
        *DISABLED,
        f"--addr=127.0.0.1:{metrics_port}",
        *extra,
    ]


@dataclass
class KoordletProcess:
    """A started koordlet: its process, log and metrics port."""

    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    argv: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


@contextlib.contextmanager
def running_koordlet(
    cp: ControlPlane,
    node: SyntheticNode,
    node_name: str,
    kubelet: FakeKubelet,
    workdir: Path,
    *extra: str,
    token: str | None = None,
) -> Iterator[KoordletProcess]:
    """koordlet as a subprocess (kubeconfig from KUBECONFIG, node from NODE_NAME), stopped on exit.

    The admin token by default: koordlet's own ClusterRole is not installed here (the chart's is koordqos's).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = cp.write_kubeconfig(workdir / "koordlet-kubeconfig", token or cp.admin_token)
    port = free_port()
    argv = koordlet_argv(node, workdir, kubelet.port, port, *extra)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NODE_NAME": node_name}
    log = workdir / "koordlet.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    koordlet = KoordletProcess(proc, log, port, argv)
    try:
        yield koordlet
    finally:
        koordlet.stop()
