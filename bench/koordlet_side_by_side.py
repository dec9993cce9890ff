"""koordlet and koordqos side by side on the same synthetic node: CPU (% of a core) and RSS (#33 item 4).

One real control plane (etcd + kube-apiserver, tests/apiserver/controlplane.py) for the whole bench; each run
makes two Nodes, one per agent, with the same NodeSLO (BE CPU suppress on) and NodeMetric (Koordinator's
60 s report interval), and N pods (half LS, Burstable; half BE, batch resources): created in the API server
bound to koordqos's Node, and the same objects served to koordlet by a fake kubelet (koordlet reads pods from
the kubelet's /pods/, not from the API server). Each agent has its own copy of the synthetic node
(koordqos.testing.nodefs, the pods' and containers' cgroup dirs made as a runtime would). Both agents run at
the same time — the same minutes, the same load — in cluster mode, NRI off on both (no runtime here).

After the start and a warm-up, two windows: *steady* (the node's /proc/stat advances, nothing else changes)
and *churn* (36 pod creations per second: created in the API server and marked Running, added to the fake
kubelet and to both synthetic nodes; each deleted again 2.5 s later, so the node holds about N + 90 pods).
Per window and agent: CPU = utime + stime (+ reaped children: koordlet runs `lscpu`) over the window in % of
one core, and RSS (VmRSS) sampled every second: the window's median and maximum. The median of `--runs` runs.
The load average is printed with each run: the figures mean nothing without it.

Run: `PYTHONPATH=. python bench/koordlet_side_by_side.py [--quick] [--pods 50 200 1000] [--runs 3]`
(koordlet built first: `python -m tests.apiserver.koordinator koordlet`, cgo and libpfm4-dev needed).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import machine, median, table
from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import GiB, SyntheticNode
from tests.apiserver.agentproc import running_agent
from tests.apiserver.controlplane import (
    KOORDINATOR_VERSION,
    Api,
    ApiError,
    ControlPlane,
    build_binaries,
    koordinator_crds,
    running_control_plane,
)
from tests.apiserver.koordlet import (
    DISABLED,
    KOORDLET,
    FakeKubelet,
    create_kubelet_node,
    prepare_node,
    running_koordlet,
)
from tests.apiserver.kubeobjects import (
    NODEMETRIC_PATH,
    NODESLO_PATH,
    create_namespace,
    ensure_priority_class,
    eventually,
    nodemetric,
    nodeslo,
    running_status,
)

CPUS = 8
MEMORY = 32 * GiB
TICK_S = 0.5
CREATES_PER_TICK = 18  # 36 pod creations per second in the churn window
LIFETIME_TICKS = 5  # a churn pod is deleted 2.5 s after its creation
WORKERS = 8  # API calls in flight (the churn needs about 108 calls a second)
SLO = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}}
AGENTS = ("koordlet", "koordqos")


class KeepAliveApi(Api):
    """`Api` over one kept-alive HTTPS connection per thread (urllib's handshake per request is too slow for
    the churn's rate)."""

    def _conn(self) -> http.client.HTTPSConnection:
        local = self.__dict__.setdefault("_local", threading.local())
        conn: http.client.HTTPSConnection | None = getattr(local, "conn", None)
        if conn is None:
            url = urllib.parse.urlsplit(self.url)
            conn = http.client.HTTPSConnection(
                url.hostname or "", url.port, context=self.ssl_context, timeout=30
            )
            local.conn = conn
        return conn

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):  # a connection the server closed while idle: once more on a new one
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self.__dict__["_local"].conn = None
                if attempt == 2:
                    raise
        doc = json.loads(raw) if raw else {}
        if resp.status >= 300:
            raise ApiError(resp.status, doc if isinstance(doc, dict) else {})
        return doc


# -- measuring -------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of a process (children it waited for included), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Window:
    """One agent over one window."""

    cpu_percent: float
    rss_median_mib: float
    rss_max_mib: float


@dataclass
class Sampler:
    """CPU at the window's ends, RSS every second, of each agent's pid."""

    pids: dict[str, int]
    cpu0: dict[str, float] = field(default_factory=dict)
    rss: dict[str, list[int]] = field(default_factory=lambda: collections.defaultdict(list))
    t0: float = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.sample()

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.rss[name].append(rss_bytes(pid))

    def finish(self) -> dict[str, Window]:
        self.sample()
        elapsed = time.monotonic() - self.t0
        out = {}
        for name, pid in self.pids.items():
            cpu = cpu_seconds(pid) - self.cpu0[name]
            rss = self.rss[name]
            out[name] = Window(
                round(100 * cpu / elapsed, 2),
                round(statistics.median(rss) / 2**20, 1),
                round(max(rss) / 2**20, 1),
            )
        return out


# -- the node and its pods -------------------------------------------------------------------------------


@dataclass
class Setup:
    """One run's objects: the two nodes, the fake kubelet, the namespace."""

    api: KeepAliveApi
    ns: str
    names: dict[str, str]  # agent → Node name
    nodes: dict[str, SyntheticNode]
    kubelet: FakeKubelet
    pool: ThreadPoolExecutor
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pod_spec(self, i: int) -> tuple[str, int, dict[str, str], dict[str, str]]:
        """(QoS, priority, requests, limits): odd pods BE with batch resources, even pods LS (Burstable)."""
        if i % 2:
            batch = {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}
            return "BE", 5500, batch, dict(batch)
        return "LS", 9500, {"cpu": "500m", "memory": "512Mi"}, {"cpu": "1", "memory": "1Gi"}

    def create(self, name: str, i: int) -> dict[str, Any]:
        """A Running pod in the API server (koordqos's Node), in the kubelet (koordlet's), on both nodes."""
        pod = running_pod(self.api, self.ns, name, self.names["koordqos"], self.pod_spec(i))
        for node in self.nodes.values():
            node.set_memory(node.add_pod(parse_pod(pod)), 64 << 20, anon=64 << 20)
        return pod

    def delete(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.api.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}?gracePeriodSeconds=0")
        info = parse_pod(pod)
        for node in self.nodes.values():
            node.remove_cgroup(node.layout.pod_dir(info))


def running_pod(
    api: Api, ns: str, name: str, node: str, shape: tuple[str, int, dict[str, str], dict[str, str]]
) -> dict[str, Any]:
    """kubeobjects.create_running_pod in two calls (its PriorityClass made once, up front)."""
    qos, priority, requests, limits = shape
    container = {"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": limits}}
    spec = {
        "nodeName": node,
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
        "priorityClassName": f"e2e-priority-{priority}",
    }
    meta = {"name": name, "labels": {"koordinator.sh/qosClass": qos}}
    pod = api.create(
        f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    )
    pod["status"] = running_status(pod)
    return dict(api.put(f"/api/v1/namespaces/{ns}/pods/{name}/status", pod))


def for_koordlet(pod: dict[str, Any], node: str) -> dict[str, Any]:
    return {**pod, "spec": {**pod["spec"], "nodeName": node}}


def install_crds(api: Api) -> None:
    for crd in koordinator_crds():
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for crd in koordinator_crds():
        name = crd["metadata"]["name"]

        def established(name: str = name) -> bool:
            doc = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = (doc.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        eventually(established, 60, f"CRD {name} established")


def make_setup(cp: ControlPlane, workdir: Path, pods: int) -> tuple[Setup, list[dict[str, Any]]]:
    api = KeepAliveApi(cp.url, cp.admin_token, cp.ssl_context())
    tag = secrets.token_hex(3)
    ns = f"sbs-{tag}"
    create_namespace(api, ns)
    for priority in (5500, 9500):
        ensure_priority_class(api, priority)
    names = {agent: f"{agent}-{tag}" for agent in AGENTS}
    kubelet = FakeKubelet().start()
    nodes = {}
    for agent in AGENTS:
        node = SyntheticNode(workdir / f"node-{agent}", cpus=CPUS, memory_total=MEMORY)
        prepare_node(node, MEMORY)
        nodes[agent] = node
        create_kubelet_node(api, names[agent], kubelet.port, str(CPUS), f"{MEMORY // GiB}Gi")
        api.create(NODESLO_PATH, nodeslo(names[agent], SLO))
        api.create(NODEMETRIC_PATH, nodemetric(names[agent], 60))
    setup = Setup(api, ns, names, nodes, kubelet, ThreadPoolExecutor(WORKERS))
    made = list(setup.pool.map(lambda i: setup.create(f"p-{i}", i), range(pods)))
    kubelet.set_pods(for_koordlet(p, names["koordlet"]) for p in made)
    return setup, made


# -- a run -----------------------------------------------------------------------------------------------


@dataclass
class Churn:
    """The churn window's pod creations and deletions, 18 every 0.5 s."""

    setup: Setup
    created: int = 0
    failed: int = 0
    pending: collections.deque[tuple[int, Future[dict[str, Any]]]] = field(default_factory=collections.deque)
    serial: int = 0

    def tick(self, tick: int) -> None:
        s = self.setup
        in_flight = sum(1 for _, fut in self.pending if not fut.done())
        # no backlog: when the driver (or the API server) cannot keep up, this tick's creations are skipped
        # and the rate reached is what the figures are at (creates_per_s)
        for _ in range(CREATES_PER_TICK if in_flight < CREATES_PER_TICK else 0):
            self.serial += 1
            name = f"churn-{self.serial}"
            i = self.serial
            fut = s.pool.submit(self._create, name, i)
            self.pending.append((tick, fut))
        while self.pending and self.pending[0][0] <= tick - LIFETIME_TICKS:
            _, fut = self.pending.popleft()
            s.pool.submit(self._delete, fut)

    def _create(self, name: str, i: int) -> dict[str, Any]:
        pod = self.setup.create(name, i)
        self.setup.kubelet.update(add=[for_koordlet(pod, self.setup.names["koordlet"])])
        with self.setup.lock:
            self.created += 1
        return pod

    def _delete(self, fut: Future[dict[str, Any]]) -> None:
        try:
            pod = fut.result()
        except (ApiError, OSError, http.client.HTTPException):
            with self.setup.lock:
                self.failed += 1
            return
        self.setup.kubelet.update(remove=[pod["metadata"]["uid"]])
        self.setup.delete(pod)

    def drain(self) -> None:
        for _, fut in self.pending:
            self.setup.pool.submit(self._delete, fut)
        self.pending.clear()


def measure(setup: Setup, pids: dict[str, int], seconds: float, churn: Churn | None) -> dict[str, Any]:
    sampler = Sampler(pids)
    sampler.start()
    t0 = time.monotonic()
    tick = 0
    while time.monotonic() - t0 < seconds:
        for node in setup.nodes.values():
            node.advance_node_cpu(busy_ticks=150 * CPUS // 4, idle_ticks=250 * CPUS // 4)
        if churn is not None:
            churn.tick(tick)
        if tick % 2 == 0:
            sampler.sample()
        tick += 1
        time.sleep(max(0.0, t0 + tick * TICK_S - time.monotonic()))
    windows = sampler.finish()
    elapsed = time.monotonic() - t0
    out: dict[str, Any] = {name: asdict(w) for name, w in windows.items()}
    if churn is not None:
        out["creates_per_s"] = round(churn.created / elapsed, 1)
        out["create_failures"] = churn.failed
    return out


def one_run(cp: ControlPlane, pods: int, warmup: float, window: float, workdir: Path) -> dict[str, Any]:
    load0 = os.getloadavg()
    t_setup = time.monotonic()
    setup, _ = make_setup(cp, workdir, pods)
    result: dict[str, Any] = {"pods": pods, "setup_s": round(time.monotonic() - t_setup, 1)}
    try:
        with contextlib.ExitStack() as stack:
            koordlet = stack.enter_context(
                running_koordlet(
                    cp, setup.nodes["koordlet"], setup.names["koordlet"], setup.kubelet, workdir / "koordlet"
                )
            )
            koordqos = stack.enter_context(
                running_agent(
                    cp,
                    setup.nodes["koordqos"],
                    setup.names["koordqos"],
                    workdir,
                    "--log-level=warning",
                    token=cp.admin_token,
                )
            )
            eventually(lambda: setup.kubelet.requests > 0, 60, "koordlet reading the fake kubelet")
            time.sleep(warmup)  # a warm-up period, not synchronisation: both are up (above)
            for name, proc in (("koordlet", koordlet.proc), ("koordqos", koordqos.proc)):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}")
            pids = {"koordlet": koordlet.pid, "koordqos": koordqos.pid}
            result["steady"] = measure(setup, pids, window, None)
            churn = Churn(setup)
            result["churn"] = measure(setup, pids, window, churn)
            churn.drain()
            result["kubelet_answers_abandoned"] = setup.kubelet.abandoned
            result["koordlet_log_errors"] = sum(
                1 for line in koordlet.log.read_text(errors="replace").splitlines() if line.startswith("E")
            )
    finally:
        setup.pool.shutdown(wait=True)
        setup.kubelet.stop()
    result["load"] = [round(x, 2) for x in (*load0, *os.getloadavg())]
    return result


# -- the table -------------------------------------------------------------------------------------------


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for win in ("steady", "churn"):
        for agent in AGENTS:
            for key in ("cpu_percent", "rss_median_mib", "rss_max_mib"):
                out[f"{win}.{agent}.{key}"] = median([r[win][agent][key] for r in runs])
    out["churn.creates_per_s"] = median([r["churn"]["creates_per_s"] for r in runs])
    return out


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def render(summary: dict[int, dict[str, Any]]) -> str:
    rows = []
    for pods, s in summary.items():
        for win in ("steady", "churn"):
            k = {
                a: {m: s[f"{win}.{a}.{m}"] for m in ("cpu_percent", "rss_median_mib", "rss_max_mib")}
                for a in AGENTS
            }
            label = "steady" if win == "steady" else f"churn ({s['churn.creates_per_s']:.0f} pods/s)"
            rows.append(
                [
                    f"{pods:,}",
                    label,
                    f"{k['koordlet']['cpu_percent']:.1f} %",
                    f"{k['koordqos']['cpu_percent']:.1f} %",
                    ratio(k["koordqos"]["cpu_percent"], k["koordlet"]["cpu_percent"]),
                    f"{k['koordlet']['rss_median_mib']:.0f} ({k['koordlet']['rss_max_mib']:.0f})",
                    f"{k['koordqos']['rss_median_mib']:.0f} ({k['koordqos']['rss_max_mib']:.0f})",
                    ratio(k["koordqos"]["rss_median_mib"], k["koordlet"]["rss_median_mib"]),
                ]
            )
    header = [
        "pods",
        "window",
        "koordlet CPU",
        "koordqos CPU",
        "CPU ratio",
        "koordlet RSS MiB median (max)",
        "koordqos RSS MiB median (max)",
        "RSS ratio",
    ]
    return table(rows, header)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one run at 50 pods, 5 s warm-up, 10 s windows")
    p.add_argument("--pods", type=int, nargs="+", default=[50, 200, 1000])
    p.add_argument("--runs", type=int, default=3, help="runs per size to take the median of")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds after both agents are up")
    p.add_argument("--window", type=float, default=60.0, help="seconds of each window (steady, churn)")
    p.add_argument("--json", type=Path, help="write every run's figures here")
    p.add_argument("--keep", action="store_true", help="keep the work dir (the agents' logs) afterwards")
    args = p.parse_args()
    # stopped with SIGTERM: unwind, so that the agents and the control plane are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.pods, args.runs, args.warmup, args.window = [50], 1, 5.0, 10.0
    if not KOORDLET.is_file():
        print(
            f"koordlet {KOORDINATOR_VERSION} not built ({KOORDLET}): `python -m tests.apiserver.koordinator`"
        )
        return 2
    print(machine())
    print(f"koordlet {KOORDINATOR_VERSION}: {KOORDLET}; switched off: {', '.join(DISABLED)}")
    base = Path(tempfile.mkdtemp(prefix="koordlet-sbs-"))
    all_runs: dict[int, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as cleanup, running_control_plane(build_binaries(base / "build")) as cp:
        if not args.keep:
            cleanup.callback(shutil.rmtree, base, True)
        install_crds(cp.api())
        for pods in args.pods:
            for run in range(args.runs):
                r = one_run(cp, pods, args.warmup, args.window, base / f"run-{pods}-{run}")
                all_runs.setdefault(pods, []).append(r)
                print(json.dumps(r), flush=True)
    summary = {pods: summarise(runs) for pods, runs in all_runs.items()}
    print()
    print(render(summary))
    if args.json:
        args.json.write_text(json.dumps({"runs": all_runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
