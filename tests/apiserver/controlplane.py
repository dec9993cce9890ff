"""A real control plane for the e2e-apiserver tests (envtest-style): etcd + kube-apiserver on loopback.

* `build_binaries()` builds both from `go/` (the Go module proxy is the only source) and caches them by
  version and by a digest of the Go sources, under `~/.cache/koordqos-e2e/<name>-<version>-<digest>/`.
* `ControlPlane` starts them in a temporary directory: etcd with its own data dir, kube-apiserver with
  `--authorization-mode=RBAC`, a generated service-account key (openssl), a static token file (an admin
  token in `system:masters` and an agent token that authenticates as the chart's service account) and a
  self-signed serving certificate; `stop()` kills both and removes the directory.
* `Api` is a small synchronous JSON client (urllib) the tests use as admin or as the agent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.agentproc import free_port

HERE = Path(__file__).resolve().parent
GO_DIR = HERE / "go"
CACHE_ROOT = Path(os.environ.get("KOORDQOS_E2E_CACHE", "~/.cache/koordqos-e2e")).expanduser()
# The chart's service account, as rendered with tests/chart's release values.
AGENT_NAMESPACE = "koordqos-system"
AGENT_SERVICE_ACCOUNT = "koordqos"
AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
# A cold build on 2 shared cores takes minutes; CI's whole run has 90.
BUILD_TIMEOUT_SECONDS = float(os.environ.get("KOORDQOS_E2E_BUILD_TIMEOUT", "2700"))
START_TIMEOUT_SECONDS = 120.0


class Unavailable(Exception):
    """The binaries cannot be built or started here; the message says why (printed as the skip reason)."""


#: The Koordinator release whose CRDs (config/crd/bases) the suite installs: the real schemas, not ours.
KOORDINATOR_MODULE = "github.com/koordinator-sh/koordinator"
KOORDINATOR_VERSION = "v1.8.0"
KOORDINATOR_CRDS = (
    "slo.koordinator.sh_nodeslos.yaml",
    "slo.koordinator.sh_nodemetrics.yaml",
    "topology.node.k8s.io_noderesourcetopologies.yaml",
    "scheduling.koordinator.sh_devices.yaml",
)


def koordinator_module_dir(version: str = KOORDINATOR_VERSION) -> Path:
    """The Koordinator module's source at `version`, from the Go module cache (downloaded from the Go module
    proxy once: `go mod download`, about 10 MB)."""
    go = shutil.which("go")
    if go is None:
        raise Unavailable("no go toolchain to fetch Koordinator's CRDs with")
    try:
        out = subprocess.run(
            [go, "mod", "download", "-json", f"{KOORDINATOR_MODULE}@{version}"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=tempfile.gettempdir(),  # outside any module
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(f"go mod download {KOORDINATOR_MODULE}@{version} timed out") from None
    try:
        info = json.loads(out.stdout)
    except json.JSONDecodeError:
        info = {}
    if out.returncode != 0 or not info.get("Dir"):
        why = info.get("Error") or out.stderr.strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(f"go mod download {KOORDINATOR_MODULE}@{version}: {why}")
    return Path(info["Dir"])


def koordinator_crds(version: str = KOORDINATOR_VERSION) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition the release ships (the agent's KOORDINATOR_CRDS first: NodeSLO,
    NodeMetric, NodeResourceTopology, Device; then the rest, which koord-manager needs to start)."""
    import yaml

    bases = koordinator_module_dir(version) / "config" / "crd" / "bases"
    rest = sorted(p.name for p in bases.glob("*.yaml") if p.name not in KOORDINATOR_CRDS)
    return [yaml.safe_load((bases / name).read_text()) for name in (*KOORDINATOR_CRDS, *rest)]


def module_version(module: str) -> str:
    """The version go.mod requires for `module`."""
    text = (GO_DIR / "go.mod").read_text()
    found = re.search(rf"^\s*{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if not found:
        raise Unavailable(f"{module} is not required in {GO_DIR / 'go.mod'}")
    return found.group(1)


def source_digest(name: str) -> str:
    """Digest of everything binary `name` is built from (a changed main, go.mod or go.sum rebuilds it)."""
    h = hashlib.sha256()
    for path in sorted([GO_DIR / "go.mod", GO_DIR / "go.sum", *GO_DIR.glob(f"cmd/{name}/*.go")]):
        h.update(path.relative_to(GO_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Target:
    """One binary to build: its name (= cmd/<name>), the module whose version names it."""

    name: str
    module: str

    @property
    def version(self) -> str:
        return module_version(self.module)

    @property
    def cache_dir(self) -> Path:
        return CACHE_ROOT / f"{self.name}-{self.version}-{source_digest(self.name)}"

    @property
    def path(self) -> Path:
        return self.cache_dir / self.name


KUBE_APISERVER = Target("kube-apiserver", "k8s.io/kubernetes")
ETCD = Target("etcd", "go.etcd.io/etcd/server/v3")


@dataclass
class BuildResult:
    """What building (or finding in the cache) one binary took."""

    target: str
    path: Path
    cached: bool
    seconds: float = 0.0
    max_rss_mib: float = 0.0
    load_before: str = ""
    load_after: str = ""


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def build(target: Target, log_dir: Path, timeout: float = BUILD_TIMEOUT_SECONDS) -> BuildResult:
    """The cached binary, or build it now (`go build -trimpath -ldflags='-s -w'`, CGO off), logging to a file.

    The build runs as a child polled with a deadline; its peak memory is the largest RSS among go and the
    compile/link processes it waited for (wait4's rusage).
    """
    if target.path.is_file() and os.access(target.path, os.X_OK):
        return BuildResult(target.name, target.path, cached=True)
    go = shutil.which("go")
    if go is None:
        raise Unavailable(f"{target.name} {target.version} is not built and no Go tool chain is on PATH")
    target.cache_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"build-{target.name}.log"
    partial = target.cache_dir / f".{target.name}.partial"
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
    cmd = [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(partial), f"./cmd/{target.name}"]
    load_before = _loadavg()
    start = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=GO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise Unavailable(
                    f"building {target.name} {target.version} took over {timeout:.0f}s (log: {log_path})"
                )
            time.sleep(0.5)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        raise Unavailable(
            f"building {target.name} {target.version} failed (exit {proc.returncode}, log {log_path}): "
            + " | ".join(tail)
        )
    os.replace(partial, target.path)
    result = BuildResult(
        target.name,
        target.path,
        cached=False,
        seconds=round(seconds, 1),
        max_rss_mib=round(usage.ru_maxrss / 1024, 1),
        load_before=load_before,
        load_after=_loadavg(),
    )
    (target.cache_dir / "build.json").write_text(json.dumps({**result.__dict__, "path": str(result.path)}))
    return result


def build_binaries(log_dir: Path) -> dict[str, BuildResult]:
    """etcd and kube-apiserver, built or from the cache."""
    return {t.name: build(t, log_dir) for t in (ETCD, KUBE_APISERVER)}


class ApiError(Exception):
    """A non-2xx answer."""

    def __init__(self, status: int, doc: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {doc.get('reason', '')} {doc.get('message', '')}".strip())
        self.status = status
        self.doc = doc


@dataclass
class Api:
    """JSON over HTTPS to the control plane, as the holder of `token`."""

    url: str
    token: str
    ssl_context: ssl.SSLContext

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """One request; the decoded JSON answer, ApiError on non-2xx."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ssl_context, timeout=30) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = {"message": raw[:300].decode(errors="replace")}
            raise ApiError(exc.code, doc if isinstance(doc, dict) else {}) from None
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:  # /readyz, /healthz answer text
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def create(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.call("PUT", path, body)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)

    def status_of(self, method: str, path: str, body: Any = None) -> int:
        """The HTTP status of one request (2xx included), for permission checks."""
        try:
            self.call(method, path, body)
        except ApiError as exc:
            return exc.status
        return 200


@dataclass
class ControlPlane:
    """etcd + kube-apiserver processes in a private temp dir."""

    etcd: Path
    kube_apiserver: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="koordqos-e2e-")))
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    agent_token: str = field(default_factory=lambda: secrets.token_hex(16))
    # a user with no role at all, for checks that a grant comes from the chart's role and nowhere else
    nobody_token: str = field(default_factory=lambda: secrets.token_hex(16))
    port: int = 0
    # the chart's ClusterRole as stored by the server (set by the suite's fixture)
    chart_role: dict[str, Any] = field(default_factory=dict)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started_in: float = 0.0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        # kube-apiserver writes its self-signed serving certificate followed by the CA that signed it
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def agent_requests(self) -> list[dict[str, Any]]:
        """The audit log's entries for the agent's user, one per request (a watch still open has only its
        ResponseStarted entry), in order."""
        by_id: dict[str, dict[str, Any]] = {}
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if doc.get("user", {}).get("username") == AGENT_USER:
                    by_id[str(doc.get("auditID"))] = doc
        return list(by_id.values())

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def api(self, token: str | None = None) -> Api:
        """A client as `token` (default: admin)."""
        return Api(self.url, token or self.admin_token, self.ssl_context())

    def write_kubeconfig(self, path: Path, token: str, server: str | None = None) -> Path:
        """A kubeconfig for this server (or `server`: a plain-HTTP proxy in front of it), bearer `token`."""
        cluster: dict[str, str] = {"server": server or self.url}
        if not server:
            cluster["certificate-authority"] = str(self.ca_file)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": cluster}],
            "users": [{"name": "e2e", "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
            "current-context": "e2e",
        }
        path.write_text(json.dumps(doc))
        return path

    def start(self) -> None:
        """Start etcd, then kube-apiserver; wait until /readyz answers 200 (Unavailable with logs if not)."""
        began = time.monotonic()
        try:
            self._start_etcd()
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        self.started_in = round(time.monotonic() - began, 1)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        self._procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def _wait(self, name: str, proc: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not ready():
            if proc.poll() is not None:
                raise Unavailable(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise Unavailable(f"{name} not ready in {START_TIMEOUT_SECONDS:.0f}s:\n{self.log_tail(name)}")
            time.sleep(0.1)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self._spawn(
            "etcd",
            [
                str(self.etcd),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
            ],
        )

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                    return bool(json.loads(resp.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait("etcd", proc, healthy)

    def _start_apiserver(self) -> None:
        sa_key = self.workdir / "sa.key"
        try:
            subprocess.run(
                ["openssl", "genrsa", "-out", str(sa_key), "2048"],
                check=True,
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"cannot generate the service-account key with openssl: {exc}") from None
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(
            f'{self.admin_token},admin,uid-admin,"system:masters"\n'
            f"{self.agent_token},{AGENT_USER},uid-agent,"
            f'"system:serviceaccounts,system:serviceaccounts:{AGENT_NAMESPACE}"\n'
            f"{self.nobody_token},nobody,uid-nobody\n"
        )
        audit_policy = self.workdir / "audit-policy.yaml"
        # every request the agent's user makes, with its verb, resource and answer (the RBAC test reads it)
        audit_policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
            f"- level: Metadata\n  users: [{json.dumps(AGENT_USER)}]\n- level: None\n"
        )
        self.port = free_port()
        proc = self._spawn(
            "kube-apiserver",
            [
                str(self.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--cert-dir={self.workdir / 'certs'}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # the `kubernetes` Service's endpoints may not be loopback; nothing here uses the Service
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.port}",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                # no controller-manager creates the namespaces' default ServiceAccounts
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--profiling=false",
                "--v=1",
            ],
        )

        def ready() -> bool:
            if not self.ca_file.exists():
                return False
            try:
                return bool(self.api().call("GET", "/readyz") == "ok")
            except (ApiError, OSError, ssl.SSLError):
                return False

        self._wait("kube-apiserver", proc, ready)

    def stop(self) -> None:
        """Stop both processes (SIGTERM, then SIGKILL) and remove the temp dir."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                # kube-apiserver's graceful shutdown waits for open watches (up to 15 s here): nothing of
                # this throwaway control plane needs it, its directory is removed next
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def running_control_plane(binaries: dict[str, BuildResult]) -> Iterator[ControlPlane]:
    """A started control plane, stopped and removed afterwards (also when the body fails)."""
    cp = ControlPlane(binaries["etcd"].path, binaries["kube-apiserver"].path)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()
