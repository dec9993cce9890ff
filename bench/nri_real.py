"""NRI under the real runtime code: koordqos vs a compiled Go plugin, CreateContainer p50/p99 and their ratio.

The runtime side is `tests/go/nripeer`, containerd/nri's own `pkg/adaptation` (what containerd runs) in
bench mode: one RunPodSandbox of a BE pod with batch resources, then N CreateContainer calls, each timed
around `adaptation.CreateContainer`. The plugins:
* koordqos: the agent as a real subprocess (`python -m koordqos run`, local mode, default gates) on a
  synthetic node tree, so its pod-level writes land in a temp dir;
* the yardstick: `tests/go/stubplugin`, a compiled plugin on `pkg/stub` filling the same three batch values;
  with `--stub-track` it also keeps the containers it created and subscribes to RemoveContainer, as
  koordqos does (with `--distinct` the runtime then calls both plugins on every removal).
Each run measures both, one after the other; the figures are medians over runs. Needs Go (skips otherwise).
The synthetic node has the machine's CPU count and its /proc/stat follows the machine's own (copied every
0.2 s), so the agent's metrics see the real CPU load, as its busy-poll gate (nri/busypoll.py) needs.
`--cpu` adds each plugin's CPU per call: its process's CPU time in a run of 6× the calls minus a run of the
calls, divided by the difference (start-up and warm-up cancel out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from _common import add_busy_poll, machine, median, percentile, proc_cpu_seconds, table
from koordqos.testing.nodefs import SyntheticNode, overwrite
from tests.support.agentproc import AgentLaunch, AgentPopen, agent_argv, agent_env, free_port
from tests.support.gopeer import GoUnavailable, build, run_peer

REPO = Path(__file__).resolve().parents[1]
BENCH_UID = "0b3e2c1a-bench-4e2a-9c1d-000000000001"  # tests/go/nripeer/bench.go


class StatMirror:
    """Copies the machine's /proc/stat into a synthetic proc root until stopped."""

    def __init__(self, proc_root: Path) -> None:
        self.target = proc_root / "stat"
        self.done = threading.Event()
        self.copy()
        threading.Thread(target=self._run, daemon=True).start()

    def copy(self) -> None:
        overwrite(self.target, Path("/proc/stat").read_text())

    def _run(self) -> None:
        while not self.done.wait(0.2):
            self.copy()


class CPUWatch:
    """The CPU seconds (user + system) a process has used, read from /proc until it exits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seconds = 0.0
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:  # until reaped: a zombie's stat still holds its final times
            try:
                self.seconds = proc_cpu_seconds(self.pid)
            except OSError:
                return  # gone: the last reading stands
            time.sleep(0.02)


WINDOW_OUTCOMES = ("caught", "expired", "skipped")


def busy_poll_windows(metrics_text: str) -> dict[str, float]:
    """The agent's `koordqos_nri_busy_poll_windows_total` by outcome, and its mean plugin-side time of a
    CreateContainer in µs ("plugin_mean", from `koordqos_nri_request_seconds`), from its /metrics text."""
    out = dict.fromkeys(WINDOW_OUTCOMES, 0.0)
    seconds = {"_sum": 0.0, "_count": 0.0}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "koordqos_nri_busy_poll_windows":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("outcome") in out:
                    out[sample.labels["outcome"]] = sample.value
        elif family.name == "koordqos_nri_request_seconds":
            for sample in family.samples:
                suffix = sample.name.removeprefix(family.name)
                if suffix in seconds and sample.labels.get("method") == "CreateContainer":
                    seconds[suffix] = sample.value
    if seconds["_count"]:
        out["plugin_mean"] = seconds["_sum"] / seconds["_count"] * 1e6
    return out


def one(
    peer: Path,
    plugin: str,
    stub: Path,
    calls: int,
    event_loop: str | None = None,
    distinct: bool = False,
    busy_poll: float | None = None,
    stub_track: bool = False,
) -> dict[str, float]:
    """One measurement of `plugin` ("koordqos" | "stub"): p50/p99 in µs, the CPU seconds its process
    used in all ("cpu"), and for koordqos its busy-poll windows by outcome (so a run shows whether the agent
    polled: session 29 found every loaded run had, its gate not knowing the node's usage yet)."""
    watch: list[CPUWatch] = []
    windows: dict[str, float] = {}
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="kqnrireal-", dir="/tmp"))
    sock = tmp / "nri.sock"
    mirror: StatMirror | None = None
    try:
        node = SyntheticNode(tmp / "node", cpus=os.cpu_count() or 1)
        node.make_cgroup(f"kubepods/besteffort/pod{BENCH_UID}")
        mirror = StatMirror(node.proc_root)

        def start() -> subprocess.Popen[bytes] | AgentPopen:
            proc: subprocess.Popen[bytes] | AgentPopen
            if plugin == "stub":
                cmd = [str(stub), "-socket", str(sock), *(["-track"] if stub_track else [])]
                proc = subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=agent_env(home=tmp)
                )
            else:
                cmd = agent_argv(
                    "--nri-socket",
                    str(sock),
                    "--cgroup-root",
                    str(node.cgroup_root),
                    "--proc-root",
                    str(node.proc_root),
                    "--sys-root",
                    str(node.sys_root),
                    "--http-addr",
                    f"127.0.0.1:{port}",
                    "--log-level",
                    "warning",
                )
                if event_loop is not None:
                    cmd += ["--event-loop", event_loop]
                if busy_poll is not None:
                    cmd += ["--nri-busy-poll-seconds", str(busy_poll)]
                proc = AgentPopen(AgentLaunch(cmd, tmp / "agent.log", port, agent_env(home=tmp))).start()
            watch.append(CPUWatch(proc.pid))
            return proc

        args = ["-bench", str(calls), *(["-distinct"] if distinct else [])]

        def scrape() -> None:
            if plugin != "stub":
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=10) as resp:
                    windows.update(busy_poll_windows(resp.read().decode()))

        out = run_peer(peer, sock, args, start, timeout=600, before_stop=scrape)
    finally:
        if mirror is not None:
            mirror.done.set()
        shutil.rmtree(tmp, ignore_errors=True)
    if out["adjusted"] != calls:
        raise SystemExit(f"{plugin}: only {out['adjusted']} of {calls} CreateContainer replies were adjusted")
    ns = out["ns"][calls // 10 :]  # the first tenth warms both up (imports, caches)
    cpu = watch[0].seconds if watch else 0.0
    return {"p50": percentile(ns, 50) / 1e3, "p99": percentile(ns, 99) / 1e3, "cpu": cpu, **windows}


def main() -> None:
    from _common import parser

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument(
        "--event-loop",
        choices=["auto", "asyncio", "uvloop"],
        default=None,
        help="the agent's --event-loop (default: the agent's own default)",
    )
    p.add_argument(
        "--distinct",
        action="store_true",
        help="a new container for every call (the one of 16 calls earlier removed, untimed), as on a real "
        "node; default: 16 container ids in turn",
    )
    p.add_argument(
        "--stub-track",
        action="store_true",
        help="the Go plugin also keeps its containers and subscribes to RemoveContainer, as koordqos does",
    )
    add_busy_poll(p)
    p.add_argument("--cpu", action="store_true", help="also measure each plugin's CPU per call")
    args = p.parse_args()
    calls = 300 if args.quick else args.calls
    runs = 1 if args.quick else args.runs
    try:
        peer = build(REPO / "tests" / "go" / "nripeer")
        stub = build(REPO / "tests" / "go" / "stubplugin")
    except GoUnavailable as exc:
        print(f"NRI real-runtime benchmark skipped: {exc}")
        return
    results: dict[str, list[dict[str, float]]] = {"koordqos": [], "stub": []}
    cpu: dict[str, list[float]] = {"koordqos": [], "stub": []}  # µs per call
    for _ in range(runs):
        for plugin in ("stub", "koordqos"):
            opts = (args.event_loop, args.distinct, args.busy_poll, args.stub_track)
            res = one(peer, plugin, stub, calls, *opts)
            results[plugin].append(res)
            if args.cpu:
                long = one(peer, plugin, stub, 6 * calls, *opts)
                cpu[plugin].append((long["cpu"] - res["cpu"]) / (5 * calls) * 1e6)
    load = os.getloadavg()
    med = {pl: {k: median([r[k] for r in rs]) for k in ("p50", "p99")} for pl, rs in results.items()}
    ratios = {k: med["koordqos"][k] / med["stub"][k] for k in ("p50", "p99")}
    print(
        f"NRI real runtime (containerd/nri pkg/adaptation) — {machine()}; {calls} CreateContainer calls, "
        f"{'a new container each' if args.distinct else '16 container ids in turn'}; "
        f"median of {runs} run(s); agent event loop {args.event_loop or 'default'}; busy poll "
        f"{'default' if args.busy_poll is None else args.busy_poll}; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        table(
            [
                ["koordqos (Python)", f"{med['koordqos']['p50']:.0f} µs", f"{med['koordqos']['p99']:.0f} µs"],
                [
                    f"Go plugin on pkg/stub{' (tracking removals)' if args.stub_track else ''}",
                    f"{med['stub']['p50']:.0f} µs",
                    f"{med['stub']['p99']:.0f} µs",
                ],
                ["ratio koordqos / Go", f"{ratios['p50']:.2f}×", f"{ratios['p99']:.2f}×"],
            ],
            ["CreateContainer through pkg/adaptation", "p50", "p99"],
        )
    )
    per_run = [
        f"{k['p50']:.0f}/{k['p99']:.0f} vs {s['p50']:.0f}/{s['p99']:.0f}"
        for k, s in zip(results["koordqos"], results["stub"], strict=True)
    ]
    print("per run (koordqos p50/p99 vs Go p50/p99, µs): " + "; ".join(per_run))
    means = [r["plugin_mean"] for r in results["koordqos"] if "plugin_mean" in r]
    if means:
        # the rest of the round trip is the runtime's and the kernel's: a reply that comes later than the
        # Go runtime spins for costs the runtime a wake-up too (docs/performance.md, session 31)
        print(
            f"koordqos plugin-side CreateContainer, the agent's own mean (per run): "
            f"{', '.join(f'{v:.1f}' for v in means)} µs"
        )
    polled = [[r.get(k, 0.0) for k in WINDOW_OUTCOMES] for r in results["koordqos"]]
    print(
        "koordqos busy-poll windows caught / expired / skipped (whole run, per run): "
        + "; ".join(" / ".join(f"{v:.0f}" for v in row) for row in polled)
    )
    if args.cpu:
        print(
            f"CPU per call (median; per run): koordqos {median(cpu['koordqos']):.0f} µs "
            f"({', '.join(f'{c:.0f}' for c in cpu['koordqos'])}), Go plugin {median(cpu['stub']):.0f} µs "
            f"({', '.join(f'{c:.0f}' for c in cpu['stub'])})"
        )


if __name__ == "__main__":
    main()
