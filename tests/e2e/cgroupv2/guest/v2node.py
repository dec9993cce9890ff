"""The guest side's parts: the VM's real cgroup v2 hierarchy laid out as a kubelet lays it out, the mock NRI
runtime on its own thread, the agent as a subprocess (`python -m koordqos run`) and CPU burners.

Everything here runs inside the v2 VM (tools/v2vm/run.py): /sys/fs/cgroup is the VM kernel's cgroup2 mount,
the whole root is the host's read-only under a tmpfs overlay, so nothing reaches the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from koordqos.nri.api import nri_api_pb2 as api
from koordqos.testing.agentrunner import AgentLaunch, AgentPopen, agent_argv, agent_env, free_port
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.poll import wait_until_sync

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuset", "io", "memory", "pids")
GiB = 1 << 30
MiB = 1 << 20
POLL = 0.25  # seconds between polls: under TCG every /metrics scrape costs the agent tens of ms
SETTLE = 90.0  # the longest a condition may take under TCG on a loaded host
T = TypeVar("T")


def in_v2_vm() -> str | None:
    """Why this is not the v2 VM (None when it is): the guest tests write the real /sys/fs/cgroup."""
    if os.environ.get("V2VM") != "1":
        return "not inside the v2 VM (tools/v2vm/run.py sets V2VM=1)"
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError as exc:
        return f"cannot read /proc/self/mounts: {exc}"
    if not any(line.split()[1:3] == [str(ROOT), "cgroup2"] for line in mounts.splitlines()):
        return f"{ROOT} is not a cgroup2 mount"
    return None


# -- the cgroup tree -----------------------------------------------------------------------------------


def read(rel: str, name: str) -> str:
    """A cgroup file's content, stripped ("" for an empty file)."""
    return (ROOT / rel / name).read_text().strip()


def write(rel: str, name: str, value: str | int) -> None:
    (ROOT / rel / name).write_text(f"{value}\n")


def flat_keyed(rel: str, name: str) -> dict[str, int]:
    """A flat-keyed file (cpu.stat, memory.stat) as a dict."""
    out = {}
    for line in read(rel, name).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def quota_of(rel: str) -> int:
    """The quota field of cpu.max (-1 for max)."""
    q = read(rel, "cpu.max").split()[0]
    return -1 if q == "max" else int(q)


def make_dir(rel: str, *, leaf: bool = False) -> None:
    """A cgroup dir; an inner one enables the controllers for its children, as the kubelet's do."""
    path = ROOT / rel
    path.mkdir(exist_ok=True)
    if not leaf:
        write(rel, "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))


def remove_tree(rel: str) -> None:
    """Remove a cgroup subtree bottom-up (its processes must be gone)."""
    path = ROOT / rel
    if not path.is_dir():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


# -- pods as the runtime reports them ------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    """One pod: its sandbox and container messages and their cgroup dirs (cgroupfs driver)."""

    sandbox: api.PodSandbox
    container: api.Container
    pod_dir: str
    ctr_dir: str

    @property
    def name(self) -> str:
        return self.sandbox.name


def make_pod(
    name: str,
    uid: str,
    qos: str,
    kube_qos: str,
    ctr_name: str,
    *,
    cpu_m: int = 0,
    mem: int = 0,
    annotations: dict[str, str] | None = None,
) -> Pod:
    """The NRI messages of a one-container pod and its cgroup dirs under kubepods (cgroupfs)."""
    sandbox = api.PodSandbox(
        id=f"sbx-{name}".ljust(16, "0"),
        name=name,
        uid=uid,
        namespace="default",
        labels={"koordinator.sh/qosClass": qos, "io.kubernetes.pod.uid": uid},
        annotations=annotations or {},
    )
    parent = "kubepods" if kube_qos == "guaranteed" else f"kubepods/{kube_qos}"
    pod_dir = f"{parent}/pod{uid}"
    sandbox.linux.cgroup_parent = "/" + pod_dir
    cid = (name.replace("-", "") + "0" * 64)[:64]
    ctr = api.Container(id=cid, pod_sandbox_id=sandbox.id, name=ctr_name, state=api.CONTAINER_CREATED)
    res = ctr.linux.resources
    res.cpu.shares.value = max(2, cpu_m * 1024 // 1000)
    res.cpu.quota.value = cpu_m * 100 if cpu_m else -1
    res.cpu.period.value = 100000
    res.memory.limit.value = mem
    ctr.linux.cgroups_path = f"/{pod_dir}/{cid}"
    return Pod(sandbox, ctr, pod_dir, f"{pod_dir}/{cid}")


def lay_out(pod: Pod) -> None:
    """What the kubelet and runc make for the pod: its dirs with their requests and limits applied."""
    make_dir(pod.pod_dir)
    make_dir(pod.ctr_dir, leaf=True)
    res = pod.container.linux.resources
    weight = 1 + ((res.cpu.shares.value - 2) * 9999) // 262142  # runc's shares → weight
    for rel in (pod.pod_dir, pod.ctr_dir):
        write(rel, "cpu.weight", weight)
        if res.cpu.quota.value > 0:
            write(rel, "cpu.max", f"{res.cpu.quota.value} {res.cpu.period.value}")
        if res.memory.limit.value > 0:
            write(rel, "memory.max", res.memory.limit.value)


# -- the mock NRI runtime on a thread ------------------------------------------------------------------


class ThreadedRuntime:
    """koordqos.testing.mock_nri's runtime served from its own event loop in a thread (the tests are
    synchronous: they poll files and HTTP while the agent works)."""

    def __init__(self, sock: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mock-nri", daemon=True)
        self.rt = MockRuntime(sock, runtime_name="containerd", request_timeout=10.0)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = SETTLE) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ThreadedRuntime:
        self.thread.start()
        self.call(self.rt.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self.rt.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def start_pod(self, pod: Pod) -> api.CreateContainerResponse | None:
        """RunPodSandbox, CreateContainer, StartContainer: what a kubelet start of the pod sends."""
        self.call(self.rt.run_pod_sandbox(pod.sandbox))
        reply = self.call(self.rt.create_container(pod.sandbox, pod.container))
        pod.container.state = api.CONTAINER_RUNNING
        self.call(self.rt.start_container(pod.sandbox, pod.container))
        return reply


# -- the agent -----------------------------------------------------------------------------------------


@dataclass
class Agent:
    """`python -m koordqos run` in local mode on the VM's real roots (/sys/fs/cgroup, /proc, /sys)."""

    workdir: Path
    nri_socket: Path
    nodeslo: Path
    args: list[str] = field(default_factory=list)
    port: int = 0
    proc: AgentPopen | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "agent.log"

    def start(self) -> None:
        self.port = free_port()
        cmd = agent_argv(
            "--node-name",
            "v2vm-node",
            "--cgroup-root",
            str(ROOT),
            "--proc-root",
            "/proc",
            "--sys-root",
            "/sys",
            "--nri-socket",
            str(self.nri_socket),
            "--nri-backoff-cap-seconds",
            "1",
            "--nodeslo-file",
            str(self.nodeslo),
            "--http-addr",
            f"127.0.0.1:{self.port}",
            "--debug-endpoints",
            "--log-format",
            "json",
            *self.args,
        )
        env = agent_env(home=self.workdir)  # no ~/.kube/config: local mode
        self.proc = AgentPopen(AgentLaunch(cmd, self.log_path, self.port, env, append=True)).start()

    def get(self, path: str) -> bytes:
        proc = self.proc
        if proc is not None and proc.returncode is not None:
            raise AssertionError(f"the agent exited with {proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as resp:
                body: bytes = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
        return body

    def json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def readyz(self) -> dict[str, Any]:
        """The /readyz body; {} while the agent is not listening yet."""
        try:
            doc: dict[str, Any] = self.json("/readyz")
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return {}
        return doc

    def decisions(self) -> list[dict[str, Any]]:
        doc: list[dict[str, Any]] = self.json("/debug/decisions?limit=4096")
        return doc

    def samples(self, name: str, **labels: str) -> list[float]:
        """The values of `name`'s samples whose labels include `labels`."""
        out = []
        for line in self.get("/metrics").decode().splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, lab = head.partition("{")
            if metric == name and all(f'{k}="{v}"' in lab for k, v in labels.items()):
                out.append(float(value))
        return out

    def history(self, rel: str, limit: int = 12) -> str:
        """The agent's last decisions on files in `rel` (for failure messages)."""
        try:
            mine = [d for d in self.decisions() if d["target"].rpartition("/")[0] == rel]
        except (AssertionError, OSError, ValueError) as exc:
            return f"(no decisions: {exc})"
        lines = [
            f"{d['strategy']} {d['target'].rpartition('/')[2]} {d['action']} {d['old']} -> {d['new']}"
            f" ({d['reason']})"
            for d in mine[-limit:]
        ]
        return "\n  ".join(["decisions:", *lines]) if lines else "(no decisions on it)"

    def stop(self, timeout: float = 30.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        self.proc = None
        return proc.stop(timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
        return out


def write_nodeslo(path: Path, spec: dict[str, Any]) -> None:
    """Replace the NodeSLO file in one rename (the agent polls it by mtime, size and inode)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(spec))
    tmp.replace(path)


# -- CPU burners ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def burners(rel: str, count: int) -> Iterator[list[int]]:
    """`count` busy loops (sh) in cgroup `rel`, killed on exit."""
    procs = []
    try:
        for _ in range(count):
            p = subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"])
            procs.append(p)
            write(rel, "cgroup.procs", p.pid)
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def wait(predicate: Callable[[], bool], message: str | Callable[[], str], timeout: float = SETTLE) -> None:
    """wait_until_sync at the guest's poll interval; a callable message is made when it times out (with
    what the files and the agent say then)."""
    try:
        wait_until_sync(predicate, timeout, POLL, message if isinstance(message, str) else "condition")
    except AssertionError as exc:
        if isinstance(message, str):
            raise
        raise AssertionError(f"timed out after {timeout:g} s waiting for {message()}") from exc
