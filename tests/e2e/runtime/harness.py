"""The real runtime for the e2e-runtime suites: a private cgroup view, containerd, crictl and the agent.

Everything runs on private paths: containerd's sockets, root and state live in a temp dir, never in
/run/containerd or /var/lib/containerd. The cgroups are a uniquely named scratch tree
`/sys/fs/cgroup/<hierarchy>/koordqos-e2e-<hex>` in every hierarchy; containerd (with its shims and runc) and
the agent run in a private mount namespace where that tree is bind-mounted over `/sys/fs/cgroup/<hierarchy>`.
So pods use the ordinary cgroupfs parent `/kubepods/besteffort/pod<uid>`, the agent runs with
`--cgroup-root /sys/fs/cgroup`, both agree on every dir as on a real node, and neither can reach a cgroup
outside the scratch tree. The tests read the same kernel files from the host's view
(`/sys/fs/cgroup/<hierarchy>/koordqos-e2e-<hex>/kubepods/...`). The agent's namespace also has `/proc/sys`
read-only: it cannot write a host sysctl even by mistake.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from koordqos.testing import scratchcg
from koordqos.testing.poll import wait_until_sync

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SETUP = HERE / "setup.sh"
DEPLOYMENT_DOC = REPO / "docs" / "deployment.md"
RUN_ENV = "KOORDQOS_E2E_RUNTIME"  # "1" runs the suites (nox -s e2e-runtime sets it)
REQUIRED_ENV = "KOORDQOS_E2E_RUNTIME_REQUIRED"  # "1": a missing prerequisite fails instead of skipping
CGROUP_MNT = Path("/sys/fs/cgroup")
POLL = 0.1  # seconds between polls: each one may run crictl or read several cgroup files


class Unavailable(Exception):
    """The real runtime cannot run here; the message is the skip reason."""


# -- prerequisites and the build -----------------------------------------------------------------------


def missing_prerequisite() -> str | None:
    """Why the real runtime cannot run on this machine (None when it can)."""
    if os.geteuid() != 0:
        return "not root: containerd, runc and real cgroup writes need uid 0"
    if shutil.which("go") is None:
        return "no Go toolchain on PATH: containerd and crictl are built with `go install`"
    reason = scratchcg.unavailable_reason()
    if reason is not None:
        return f"no writable cgroup v1: {reason}"
    for tool in ("unshare", "mount", "gcc"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            return "the kernel has no overlayfs (the snapshotter containerd uses)"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    return None


@dataclass(frozen=True)
class Toolchain:
    """Paths printed by setup.sh."""

    values: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.values[key]


def build_toolchain(timeout: float = 3600.0) -> Toolchain:
    """Run setup.sh (cached by version: seconds once built); Unavailable with its error line on failure."""
    try:
        proc = subprocess.run(
            ["bash", str(SETUP)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHON": sys.executable},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(f"setup.sh did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        said = [ln for ln in lines if ln.startswith("e2e-runtime setup:")]
        detail = (said or lines or ["(no output)"])[-1]
        tail = " | ".join(lines[-4:]) if not said else ""
        raise Unavailable(f"the runtime build failed: {detail}{' | ' + tail if tail else ''}")
    values = dict(ln.split("=", 1) for ln in proc.stdout.splitlines() if "=" in ln)
    return Toolchain(values)


# -- the scratch cgroup tree and its private view ------------------------------------------------------


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy under /sys/fs/cgroup (v1 controllers, name=systemd, unified)."""
    out: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        mnt = Path(left.split()[4])
        if fstype in ("cgroup", "cgroup2") and mnt.parent == CGROUP_MNT and mnt not in out:
            out.append(mnt)
    return sorted(out)


KUBE_DIRS = ("kubepods", "kubepods/burstable", "kubepods/besteffort")


@dataclass
class CgroupTree:
    """`koordqos-e2e-<hex>` in every hierarchy, with the kubelet's QoS dirs; removed by `cleanup`."""

    name: str = field(default_factory=lambda: f"koordqos-e2e-{uuid.uuid4().hex[:10]}")
    hierarchies: list[Path] = field(default_factory=cgroup_hierarchies)

    def real(self, hierarchy: str, rel: str = "") -> Path:
        """The host's path of `rel` (a dir as the agent and runc see it, e.g. kubepods/besteffort)."""
        base = CGROUP_MNT / hierarchy / self.name
        return base / rel if rel else base

    def read(self, hierarchy: str, rel: str, name: str) -> str:
        """A cgroup file of the scratch tree, stripped."""
        return (self.real(hierarchy, rel) / name).read_text().strip()

    def _mkdir(self, d: Path) -> None:
        d.mkdir(exist_ok=True)
        if (
            d / "cpuset.cpus"
        ).exists():  # a new cpuset group is empty: copy the parent's, as the kubelet does
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((d.parent / f).read_text())

    def create(self) -> None:
        """Create the tree (the kubepods/{burstable,besteffort} dirs as a kubelet would)."""
        for h in self.hierarchies:
            self._mkdir(h / self.name)
            for rel in KUBE_DIRS:
                self._mkdir(h / self.name / rel)

    def wrap(self, argv: list[str], *, read_only_proc_sys: bool = False) -> list[str]:
        """`argv` run where the scratch tree is the whole cgroup hierarchy.

        The wrapper joins the tree's root cgroup in every hierarchy, then unshares a cgroup namespace
        (so /proc/<pid>/cgroup is relative to the tree, which runc needs to mount a container's
        /sys/fs/cgroup) and a mount namespace in which the tree is bind-mounted over each hierarchy.
        """
        join = [f"echo $$ > {h / self.name}/cgroup.procs" for h in self.hierarchies]
        binds = [f"mount --bind {h / self.name} {h}" for h in self.hierarchies]
        if read_only_proc_sys:
            binds += ["mount --bind /proc/sys /proc/sys", "mount -o remount,bind,ro /proc/sys"]
        inner = "set -e; " + "; ".join(binds) + '; exec "$@"'
        unshare = ["unshare", "--cgroup", "--mount", "--propagation", "private", "--"]
        outer = "set -e; " + "; ".join(join) + '; exec "$@"'
        return ["/bin/sh", "-c", outer, "sh", *unshare, "/bin/sh", "-c", inner, "sh", *argv]

    def procs(self) -> set[int]:
        """Every pid in any cgroup of the tree."""
        pids: set[int] = set()
        for h in self.hierarchies:
            for dirpath, _dirs, files in os.walk(h / self.name):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError, ValueError):
                        pids.update(int(p) for p in Path(dirpath, "cgroup.procs").read_text().split())
        return pids

    def cleanup(self) -> list[str]:
        """Kill what is left in the tree, remove every dir; returns problems (empty when clean)."""
        problems: list[str] = []
        deadline = time.monotonic() + 15
        while (pids := self.procs()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        if self.procs():
            problems.append(f"processes left in {self.name}: {sorted(self.procs())}")
        for h in self.hierarchies:
            try:
                scratchcg.remove_tree(h / self.name)
            except OSError as exc:
                problems.append(f"cannot remove {h / self.name}: {exc}")
        return problems


# -- containerd ----------------------------------------------------------------------------------------


def doc_nri_section(doc: Path = DEPLOYMENT_DOC) -> dict[str, Any]:
    """The `[plugins.'io.containerd.nri.v1.nri']` block users are told to write (docs/deployment.md,
    "containerd 2.x"), parsed."""
    text = doc.read_text()
    head = text.index("### containerd 2.x")
    m = re.search(r"```toml\n(.*?)```", text[head:], re.S)
    if m is None:
        raise AssertionError("docs/deployment.md: no toml block under 'containerd 2.x'")
    doc_cfg = tomllib.loads(m.group(1))
    return dict(doc_cfg["plugins"]["io.containerd.nri.v1.nri"])


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


@dataclass
class Containerd:
    """containerd on private sockets and dirs under `workdir`, in the scratch cgroup view."""

    tools: Toolchain
    tree: CgroupTree
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        return self.workdir / "nri" / "nri.sock"

    @property
    def log_path(self) -> Path:
        return self.workdir / "containerd.log"

    def nri_section(self) -> dict[str, Any]:
        """The documented NRI section; only the paths are moved into the temp dir."""
        section = doc_nri_section()
        section["socket_path"] = str(self.nri_socket)
        section["plugin_path"] = str(self.workdir / "nri" / "plugins")
        section["plugin_config_path"] = str(self.workdir / "nri" / "conf.d")
        return section

    def config_text(self) -> str:
        w = self.workdir
        nri = "\n".join(f"  {k} = {_toml_value(v)}" for k, v in self.nri_section().items())
        return f"""version = 3
root = "{w}/root"
state = "{w}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.address}"
[ttrpc]
  address = "{self.address}.ttrpc"
[debug]
  address = "{w}/debug.sock"
  level = "info"
[metrics]
  address = ""

[plugins.'io.containerd.nri.v1.nri']
{nri}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{self.tools["PAUSE_IMAGE"]}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # the test machines withhold CAP_SYS_RESOURCE: no oom_score_adj below containerd's own (the sandbox's -998)
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{self.tools["RUNC"]}"
        Root = "{w}/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{w}/cni/bin"]
    conf_dir = "{w}/cni/net.d"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    @property
    def config_path(self) -> Path:
        return self.workdir / "containerd.toml"

    def env(self) -> dict[str, str]:
        path = f"{self.tools['SHIM_DIR']}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return {"PATH": path, "HOME": str(self.workdir), "TMPDIR": str(self.workdir / "tmp")}

    def start(self, cri: CRI, timeout: float = 60.0) -> None:
        """Start containerd and wait until its CRI answers."""
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        (self.workdir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())
        log = open(self.log_path, "ab")  # noqa: SIM115 - the process owns it until stop()
        self.proc = subprocess.Popen(
            self.tree.wrap([self.tools["CONTAINERD"], "--config", str(self.config_path)]),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
        )
        log.close()
        self.starts += 1
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise Unavailable(f"containerd exited with {proc.returncode}: {self.log_tail()}")
            return cri.ok("info")

        try:
            wait_until_sync(up, timeout, POLL, "containerd's CRI to answer")
        except Unavailable as exc:
            raise AssertionError(str(exc)) from None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def ctr(self, *args: str, timeout: float = 120.0) -> str:
        proc = subprocess.run(
            [self.tools["CTR"], "--address", str(self.address), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def import_images(self) -> None:
        for key in ("PAUSE_TAR", "WORKLOAD_TAR"):
            self.ctr("images", "import", "--local", "--snapshotter", "overlayfs", self.tools[key])

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; the running containers (their shims) stay."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proc = None
        return proc.returncode

    def kill_shims(self) -> list[int]:
        """SIGKILL every process started for this containerd (shims, runc) still alive; their pids."""
        mine = str(self.workdir).encode()
        killed: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if mine in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.append(int(entry.name))
        return killed


# -- crictl --------------------------------------------------------------------------------------------


@dataclass
class CRI:
    """crictl against the private containerd."""

    crictl: str
    address: Path
    workdir: Path
    _n: int = 0

    def _cmd(self, *args: str) -> list[str]:
        ep = f"unix://{self.address}"
        return [self.crictl, "--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "30s", *args]

    def ok(self, *args: str) -> bool:
        proc = subprocess.run(self._cmd(*args), capture_output=True, timeout=60, check=False)
        return proc.returncode == 0

    def run(self, *args: str, timeout: float = 90.0) -> str:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"crictl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def _write(self, doc: dict[str, Any]) -> str:
        self._n += 1
        path = self.workdir / f"cri-{self._n}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    def run_pod(self, pod: PodSpec) -> str:
        """RunPodSandbox; the sandbox id."""
        pod.config_path = self._write(pod.config(self.workdir / "logs"))
        pod.id = self.run("runp", pod.config_path)
        return pod.id

    def create(self, pod: PodSpec, name: str, command: list[str], **resources: int) -> str:
        """CreateContainer (not started); the container id."""
        cfg = {
            "metadata": {"name": name},
            "image": {"image": WORKLOAD_IMAGE},
            "command": command,
            "log_path": f"{name}.log",
            "linux": {"resources": resources},
        }
        cid = self.run("create", pod.id, self._write(cfg), pod.config_path)
        pod.containers[name] = cid
        return cid

    def start(self, cid: str) -> None:
        self.run("start", cid)

    def run_container(self, pod: PodSpec, name: str, command: list[str], **resources: int) -> str:
        """Create and start; waits until the container runs; its id."""
        cid = self.create(pod, name, command, **resources)
        self.start(cid)
        wait_until_sync(
            lambda: self.inspect(cid)["status"]["state"] == "CONTAINER_RUNNING", 30, POLL, f"{name} running"
        )
        return cid

    def inspect(self, cid: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.run("inspect", "-o", "json", cid))
        return doc

    def pid(self, cid: str) -> int:
        return int(self.inspect(cid)["info"]["pid"])

    def update(self, cid: str, *args: str) -> None:
        self.run("update", *args, cid)

    def remove_all(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.run("rmp", "--force", "--all")


WORKLOAD_IMAGE = "localhost/koordqos-e2e/busybox:1"
SLEEP = ["/bin/sleep", "100000"]
BURN = ["/bin/sh", "-c", "while :; do :; done"]
# What the kubelet asks for a BestEffort container: the minimum shares, no quota, no memory limit.
BE_RESOURCES = {"cpu_shares": 2, "cpu_period": 100000, "cpu_quota": 0, "memory_limit_in_bytes": 0}


@dataclass
class PodSpec:
    """A pod as the kubelet would describe it to the CRI: host network, cgroupfs parent by QoS."""

    name: str
    kube_qos: str = "besteffort"  # besteffort | burstable | guaranteed
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    id: str = ""
    config_path: str = ""
    containers: dict[str, str] = field(default_factory=dict)

    @property
    def cgroup_dir(self) -> str:
        """The pod's dir relative to the hierarchy root, as runc and the agent see it."""
        qos = "" if self.kube_qos == "guaranteed" else f"/{self.kube_qos}"
        return f"kubepods{qos}/pod{self.uid}"

    def container_dir(self, name: str) -> str:
        return f"{self.cgroup_dir}/{self.containers[name]}"

    def config(self, log_dir: Path) -> dict[str, Any]:
        log_dir.mkdir(parents=True, exist_ok=True)
        return {
            "metadata": {"name": self.name, "namespace": "e2e", "uid": self.uid, "attempt": 0},
            "labels": self.labels,
            "annotations": self.annotations,
            "log_directory": str(log_dir / self.uid),
            "linux": {
                "cgroup_parent": f"/{self.cgroup_dir}",
                "security_context": {"namespace_options": {"network": 2}},  # NODE: no CNI needed
            },
        }


# -- the agent -----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Agent:
    """`python -m koordqos run` in local mode, in the scratch cgroup view, on containerd's NRI socket."""

    tree: CgroupTree
    workdir: Path
    nri_socket: Path
    args: list[str] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"agent-{self.starts}.log"

    def start(self) -> None:
        self.port = free_port()
        sys_root = self.workdir / "sys"  # nothing under the host's /sys is the agent's business here
        sys_root.mkdir(exist_ok=True)
        self.starts += 1
        cmd = [
            sys.executable,
            "-m",
            "koordqos",
            "run",
            "--node-name",
            "e2e-node",
            "--cgroup-root",
            str(CGROUP_MNT),
            "--proc-root",
            "/proc",
            "--sys-root",
            str(sys_root),
            "--nri-socket",
            str(self.nri_socket),
            "--nri-backoff-cap-seconds",
            "1",
            "--http-addr",
            f"127.0.0.1:{self.port}",
            "--debug-endpoints",
            "--log-format",
            "json",
            *self.args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KOORDQOS_") and k != "KUBECONFIG"}
        env["HOME"] = str(self.workdir)  # no ~/.kube/config: local mode
        log = open(self.log_path, "ab")  # noqa: SIM115 - the process owns it until stop()
        self.proc = subprocess.Popen(
            self.tree.wrap(cmd, read_only_proc_sys=True), stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()

    def _get(self, path: str) -> bytes:
        proc = self.proc
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the agent exited with {proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                body: bytes = resp.read()
                return body
        except urllib.error.HTTPError as exc:
            body = exc.read()
            return body

    def readyz(self) -> dict[str, Any]:
        """The /readyz body; {} while the agent is not listening yet (it is polled from start-up on)."""
        try:
            body = self._get("/readyz")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return {}
        doc: dict[str, Any] = json.loads(body)
        return doc

    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self._get("/debug/state"))
        return doc

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
        total = 0.0
        for line in self._get("/metrics").decode().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, lab = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in lab for k, v in labels.items()):
                total += float(value)
        return total

    def wait_connected(self, timeout: float = 60.0) -> None:
        """Until /readyz says the NRI plugin is registered with containerd."""
        wait_until_sync(
            lambda: self.readyz().get("nri_connected") is True, timeout, POLL, "the agent's NRI connection"
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proc = None
        return proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# -- the whole stack -----------------------------------------------------------------------------------


@dataclass
class Stack:
    """containerd + crictl + (optionally several runs of) the agent on one scratch cgroup tree."""

    tools: Toolchain
    workdir: Path
    tree: CgroupTree
    containerd: Containerd
    cri: CRI
    agents: list[Agent] = field(default_factory=list)

    def agent(self, *args: str, nodeslo: dict[str, Any] | None = None) -> Agent:
        """A (not yet started) agent; `nodeslo` is written as its --nodeslo-file."""
        extra = list(args)
        if nodeslo is not None:
            path = self.workdir / f"nodeslo-{len(self.agents)}.json"
            path.write_text(json.dumps(nodeslo))
            extra += ["--nodeslo-file", str(path)]
        a = Agent(self.tree, self.workdir, self.containerd.nri_socket, extra)
        self.agents.append(a)
        return a

    def diagnostics(self) -> str:
        parts = [f"--- containerd log ---\n{self.containerd.log_tail(30)}"]
        for i, a in enumerate(self.agents):
            parts.append(f"--- agent {i} log ---\n{a.log_tail(30)}")
        return "\n".join(parts)


@contextlib.contextmanager
def stack(tools: Toolchain) -> Iterator[Stack]:
    """Build the stack; everything is stopped and removed afterwards, also when the test fails."""
    workdir = Path(tempfile.mkdtemp(prefix="kqe2e-", dir="/tmp"))  # short: unix socket paths ≤ 107 bytes
    tree = CgroupTree()
    containerd = Containerd(tools, tree, workdir)
    cri = CRI(tools["CRICTL"], containerd.address, workdir)
    st = Stack(tools, workdir, tree, containerd, cri)
    problems: list[str] = []
    try:
        tree.create()
        containerd.start(cri)
        containerd.import_images()
        yield st
    except BaseException:
        sys.stderr.write(st.diagnostics() + "\n")
        raise
    finally:
        for a in st.agents:
            a.stop()
        if containerd.proc is not None and containerd.proc.poll() is None:
            cri.remove_all()
        containerd.stop()
        containerd.kill_shims()
        problems += tree.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
        if workdir.exists():
            problems.append(f"{workdir} not removed")
        if problems:
            sys.stderr.write("e2e-runtime cleanup: " + "; ".join(problems) + "\n")


# -- cluster mode: the project's fake API server, on a loop in a thread ----------------------------------


class ThreadedAPIServer:
    """`koordqos.testing.fake_apiserver.FakeAPIServer` served from its own event loop in a thread, so the
    synchronous tests can use it; `upsert` is passed to that loop."""

    def __init__(self) -> None:
        import asyncio
        import threading

        from koordqos.testing.fake_apiserver import FakeAPIServer

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-apiserver", daemon=True)
        self.api = FakeAPIServer()

    def __enter__(self) -> ThreadedAPIServer:
        self.thread.start()
        self._asyncio.run_coroutine_threadsafe(self.api.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._asyncio.run_coroutine_threadsafe(self.api.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def upsert(self, plural: str, obj: dict[str, Any]) -> None:
        async def do() -> None:
            self.api.upsert(plural, obj)

        self._asyncio.run_coroutine_threadsafe(do(), self.loop).result(30)

    def kubeconfig(self, path: Path) -> Path:
        return self.api.write_kubeconfig(path)
