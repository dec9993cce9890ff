"""The whole agent at N pods: CPU, resident memory, loop lag, the longest loop step, start-up to /readyz.

The agent runs as a real subprocess (`python -m koordqos run`) against a synthetic node: a fake Kubernetes
API server with N pods (`--pods`, default 200; half LS, half BE with batch resources) and an enabled NodeSLO,
a synthetic cgroup/proc/sys tree whose counters advance (with the pod, sandbox and container dirs a runtime
would have made), and a mock NRI runtime that synchronises the N pods / 2N containers. After /readyz and a
warm-up, two windows are measured: *steady* (counters advance, no runtime events) and *churn* (18
CreateContainer calls every 0.5 s: 36 /s, each a new container; each removed again 2.5 s later). In each:
CPU (utime + stime of the agent, all threads) as % of one core, loop lag p99 (the agent's 100 ms probe
histogram, this window only) and the longest single loop step with its name, from the slow-step detector
(`KOORDQOS_LOOP_WATCH`, /debug/loop; `--step-clock cpu`, the default, times steps by the loop thread's CPU
time, which on a loaded machine leaves out the time the agent waited for a core; the wall time of that step
is printed too).
The load average is printed with each run: the figures mean nothing without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from _common import machine, median, parser, proc_cpu_seconds, table
from koordqos.model.pod import parse_pod
from koordqos.testing.mock_nri.protocol import PluginDroppedError
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_pod
from koordqos.testing.nodefs import SyntheticNode
from tests.support.agentproc import AgentLaunch, AsyncAgent, agent_argv, free_port
from tests.support.agentproc import agent_env as clean_env
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodemetric, make_nodeslo, make_pod

NODE = "bench-node"
PODS = 200
PY_SPY = str(Path(sys.executable).with_name("py-spy"))  # installed next to this interpreter (the venv)
TICK_S = 0.5
CREATES_PER_TICK = 18  # 36 CreateContainer calls per second in the churn window (issue #18)
CHURN_LIFETIME_TICKS = 5  # a churn container is removed 2.5 s after its creation
WARMUP_S = 5.0  # after the first reconcile pass: the first ticks
LIST_STEPS_MS = 2.0  # the steps at least this long are listed by name


def proc_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    return rss, hwm


def lag_buckets(metrics: str) -> list[tuple[float, float]]:
    """(le, cumulative count) of koordqos_event_loop_lag_seconds from a /metrics page."""
    pattern = r'koordqos_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)'
    return [(float(m.group(1)), float(m.group(2))) for m in re.finditer(pattern, metrics)]


def lag_quantile(after: str, q: float, before: str = "") -> float:
    """Upper bound of the histogram bucket holding the q-quantile of the loop lag between two scrapes."""
    base = dict(lag_buckets(before)) if before else {}
    buckets = [(le, n - base.get(le, 0.0)) for le, n in lag_buckets(after)]
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def counter(metrics: str, name: str, labels: str) -> float:
    """One sample of a /metrics page (0 when absent); `labels` as rendered, e.g. 'type="MetricTick"'."""
    pattern = rf"^{name}\{{{re.escape(labels)}\}} ([0-9.e+]+)$" if labels else rf"^{name} ([0-9.e+]+)$"
    m = re.search(pattern, metrics, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def counters(metrics: str, name: str, label: str) -> dict[str, float]:
    """Samples of a counter summed by one label."""
    out: dict[str, float] = {}
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} ([0-9.e+]+)$", metrics, re.MULTILINE):
        value = re.search(rf'{label}="([^"]*)"', m.group(1))
        if value:
            out[value.group(1)] = out.get(value.group(1), 0.0) + float(m.group(2))
    return out


def report_writes(metrics: str, kind: str) -> float:
    """koordqos_report_writes_total{kind, outcome="written"} from a /metrics page (0 when absent)."""
    pattern = rf'koordqos_report_writes_total\{{kind="{kind}",outcome="written"\}} ([0-9.e+]+)'
    m = re.search(pattern, metrics)
    return float(m.group(1)) if m else 0.0


@dataclass
class Window:
    """One measured window of a run."""

    cpu_percent: float
    lag_p99_ms: float
    longest_ms: float
    longest_name: str
    longest_wall_ms: float  # the same step by the wall clock
    step_clock: str
    dropped: str  # the runtime dropped the plugin (a reply missed its deadline) in this window
    creates_per_s: float
    seconds: float
    cpu_ms_per_tick: float  # CPU per metrics tick: the demand, also when the load makes ticks late
    ticks: float
    planned_pods: dict[str, float]  # by reconciler pass kind
    cgroup_writes: dict[str, float]  # by outcome
    # every step of at least LIST_STEPS_MS, by name: [count, longest (step clock), its wall ms, its GC ms]
    long_steps: dict[str, list[float]]
    stacks: dict[str, list[list[Any]]]  # --step-stacks: the longest such step's sampled stacks, by name
    gc: dict[str, list[float]]  # by generation: [collections, total ms, longest ms] in this window
    gc_pauses: list[list[float]]  # [at, generation, ms] of full collections and those over 1 ms


async def _get(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as r:
        return await r.text()


def churn_container(sp: Any, tick: int) -> Any:
    """The container a churn tick creates in pod `sp`: a fresh id per tick (ids 16… of the pod)."""
    return sample_container(sp, 16 + tick)


async def churn_tick(node: SyntheticNode, churn: tuple[MockRuntime, list[Any]], tick: int) -> None:
    """One tick of churn: a new container in each of the first pods, and the one made 5 ticks ago removed.

    As a runtime would, the container's cgroup dir is made before CreateContainer and removed after
    RemoveContainer; so the node keeps 2N + 5 × 18 containers and every created one is new to the agent.
    """
    runtime, pods = churn
    for sp in pods[:CREATES_PER_TICK]:
        ctr = churn_container(sp, tick)
        pod_dir = node.layout.normalize_parent(sp.linux.cgroup_parent)
        node.make_cgroup(node.layout.container_dir_in(pod_dir, f"containerd://{ctr.id}"))
        await runtime.create_container(sp, ctr)
        if tick >= CHURN_LIFETIME_TICKS:
            old = churn_container(sp, tick - CHURN_LIFETIME_TICKS)
            await runtime.remove_container(sp, old)
            node.remove_cgroup(node.layout.container_dir_in(pod_dir, f"containerd://{old.id}"))


async def measure(
    http: aiohttp.ClientSession,
    base: str,
    pid: int,
    seconds: float,
    node: SyntheticNode,
    churn: tuple[MockRuntime, list[Any]] | None,
    profile: str = "",
) -> Window:
    """CPU, lag p99 and the longest step over `seconds`; with `churn`, 18 CreateContainer calls per 0.5 s."""
    before = await _get(http, f"{base}/metrics")
    since = time.monotonic()
    async with http.get(f"{base}/debug/loop?since={since}") as r:
        loop0 = await r.json() if r.status == 200 else {}
    cpu0 = proc_cpu_seconds(pid)
    t0 = time.monotonic()
    spy = None
    if profile:  # py-spy's collapsed stacks of the agent over this window (--nonblocking: no pauses)
        spy = await asyncio.create_subprocess_exec(
            *(PY_SPY, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "100"),
            *("--nonblocking", "--format", "raw", "--output", profile),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    calls = 0
    tick = 0
    dropped = ""
    while time.monotonic() - t0 < seconds:
        node.advance_node_cpu(busy_ticks=300, idle_ticks=500)
        if churn is not None and not dropped:
            try:
                await churn_tick(node, churn, tick)
                calls += CREATES_PER_TICK
            except PluginDroppedError as exc:  # the agent missed the runtime's 2 s deadline: say so
                dropped = str(exc)
        tick += 1
        # paced to the tick, not slept after the calls: the rate stays 36/s while each call is quick enough
        await asyncio.sleep(max(0.0, t0 + tick * TICK_S - time.monotonic()))
    elapsed = time.monotonic() - t0
    cpu = proc_cpu_seconds(pid) - cpu0
    if spy is not None:
        await spy.wait()
    after = await _get(http, f"{base}/metrics")
    async with http.get(f"{base}/debug/loop?since={since}") as r:
        loop = await r.json() if r.status == 200 else {}
    top = loop.get("longest_since") or {"seconds": 0.0, "name": "(no step ≥ 1 ms)"}
    top.setdefault("wall", top["seconds"])
    ticks = counter(after, "koordqos_bus_events_total", 'type="MetricTick"') - counter(
        before, "koordqos_bus_events_total", 'type="MetricTick"'
    )

    def delta(name: str, label: str) -> dict[str, float]:
        old = counters(before, name, label)
        return {k: v - old.get(k, 0.0) for k, v in counters(after, name, label).items()}

    long_steps: dict[str, list[float]] = {}
    stacks: dict[str, list[list[Any]]] = {}
    for step in loop.get("slow", []):
        if step["seconds"] * 1000 >= LIST_STEPS_MS:
            row = long_steps.setdefault(step["name"], [0, 0.0, 0.0, 0.0])
            row[0] += 1
            if step["seconds"] * 1000 > row[1]:
                row[1:] = [step["seconds"] * 1000, step["wall"] * 1000, step.get("gc", 0.0) * 1000]
                stacks[step["name"]] = step.get("stacks", [])
    gc: dict[str, list[float]] = {}
    for gen, now in loop.get("gc", {}).items():
        old = loop0.get("gc", {}).get(gen, {"count": 0, "seconds": 0.0})
        pauses = [p["seconds"] for p in loop.get("gc_slow", []) if str(p["generation"]) == gen]
        gc[gen] = [
            now["count"] - old["count"],
            (now["seconds"] - old["seconds"]) * 1000,
            max(pauses, default=0.0) * 1000,
        ]
    return Window(
        long_steps=dict(sorted(long_steps.items(), key=lambda kv: -kv[1][1])),
        stacks=stacks,
        gc=gc,
        gc_pauses=[[p["at"], p["generation"], p["seconds"] * 1000] for p in loop.get("gc_slow", [])],
        cpu_ms_per_tick=1000 * cpu / ticks if ticks else float("nan"),
        ticks=ticks,
        planned_pods=delta("koordqos_hooks_reconcile_planned_pods_total", "pass"),
        cgroup_writes=delta("koordqos_cgroup_writes_total", "outcome"),
        cpu_percent=100 * cpu / elapsed,
        lag_p99_ms=lag_quantile(after, 0.99, before) * 1000,
        longest_ms=top["seconds"] * 1000,
        longest_name=top["name"],
        longest_wall_ms=top["wall"] * 1000,
        step_clock=f"{loop.get('clock', 'wall')}, {loop.get('mode', 'off')}",
        dropped=dropped,
        creates_per_s=calls / elapsed,
        seconds=elapsed,
    )


async def one_run(
    pods: int,
    steady_s: float,
    churn_s: float,
    workdir: Path,
    reporting: bool = True,
    profile: str = "",
    step_clock: str = "cpu",
    event_loop: str = "",
    step_stacks: bool = False,
    agent_env: tuple[str, ...] = (),
) -> dict[str, Any]:
    node = SyntheticNode(workdir / "node", cpus=8)
    api = FakeAPIServer()
    await api.start()
    api.upsert("nodes", make_node(NODE, cpu="8", memory="16Gi"))
    api.upsert(
        "nodeslos",
        make_nodeslo(
            NODE, {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
        ),
    )
    if reporting:  # koord-manager's NodeMetric, with the shortest report interval koordlet allows
        api.upsert(
            "nodemetrics", make_nodemetric(NODE, {"metricCollectPolicy": {"reportIntervalSeconds": 30}})
        )
    nri_pods = [sample_pod(i, "besteffort" if i % 2 else "burstable") for i in range(pods)]
    for i, sp in enumerate(nri_pods):
        be = bool(i % 2)
        raw = make_pod(
            sp.name,
            NODE,
            uid=sp.uid,
            qos="BE" if be else "LS",
            requests={"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}
            if be
            else {"cpu": "500m", "memory": "512Mi"},
            limits={"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "2Gi"}
            if be
            else {"cpu": "1", "memory": "1Gi"},
        )
        api.upsert("pods", raw)
        pod_dir = node.add_pod(parse_pod(raw))
        # as on a real node: the sandbox's and the containers' cgroup dirs exist (the runtime made them)
        for cid in (sp.id, sample_container(sp, 0).id, sample_container(sp, 1).id):
            node.make_cgroup(node.layout.container_dir_in(pod_dir, f"containerd://{cid}"))
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    sock = workdir / "nri.sock"
    runtime = MockRuntime(sock)
    runtime.pods = nri_pods
    runtime.containers = [sample_container(p, j) for p in nri_pods for j in range(2)]
    await runtime.start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = agent_argv(
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        NODE,
        *node.root_flags(),
        "--nri-socket",
        str(sock),
        "--http-addr",
        f"127.0.0.1:{port}",
        "--debug-endpoints",
        "--log-level",
        "warning",
        "--log-format",
        "json",
    )
    if event_loop:
        cmd += ["--event-loop", event_loop]
    if not reporting:
        cmd += ["--enable-node-metric-report=false", "--feature-gates=NodeTopologyReport=false"]
    env = clean_env()  # without KOORDQOS_*
    if step_clock != "off":  # off: to measure what the detector itself costs
        env["KOORDQOS_LOOP_WATCH"] = ("cpu" if step_clock == "cpu" else "wall") + (
            ",stacks" if step_stacks else ""
        )
    env |= dict(kv.split("=", 1) for kv in agent_env)
    log = Path(os.environ.get("BENCH_AGENT_STDERR") or workdir / "agent.log")
    load_start = os.getloadavg()
    proc = await AsyncAgent(AgentLaunch(cmd, log, port, env)).start()
    result: dict[str, Any] = {"pods": pods}
    try:
        async with aiohttp.ClientSession() as http:
            result["startup_s"] = await proc.wait_ready(60 + pods * 0.05)
            await runtime.wait_joined(timeout=60)
            # the start-up work is not steady state: a reconciler pass that began after the Synchronize
            # must have finished (its first one writes every pod) before the warm-up starts
            passes = counter(
                await _get(http, f"{base}/metrics"), "koordqos_hooks_reconcile_seconds_count", ""
            )
            limit = time.monotonic() + 30 + pods * 0.05
            while time.monotonic() < limit:
                done = counter(
                    await _get(http, f"{base}/metrics"), "koordqos_hooks_reconcile_seconds_count", ""
                )
                if done >= passes + 1:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(WARMUP_S)
            prof = [f"{profile}-{pods}-{w}.txt" if profile else "" for w in ("steady", "churn")]
            steady = await measure(http, base, proc.pid, steady_s, node, None, prof[0])
            churn = await measure(http, base, proc.pid, churn_s, node, (runtime, nri_pods), prof[1])
            metrics = await _get(http, f"{base}/metrics")
        rss, hwm = proc_memory(proc.pid)
        result |= {
            "steady": asdict(steady),
            "churn": asdict(churn),
            "rss_mib": rss / 2**20,
            "hwm_mib": hwm / 2**20,
            "nodemetric_writes": report_writes(metrics, "NodeMetric"),
            "nrt_writes": report_writes(metrics, "NodeResourceTopology"),
            "load": [load_start, os.getloadavg()],
        }
        t_stop = time.monotonic()
        rc = await proc.stop(10 + pods * 0.01)  # SIGTERM; SIGKILL (rc -9) after the deadline
        result["stop_s"] = time.monotonic() - t_stop
        result["rc"] = rc
    finally:
        await proc.stop()
        await runtime.stop()
        await api.stop()
    return result


def main() -> None:
    p = parser(__doc__ or "")
    p.set_defaults(runs=3)
    p.add_argument("--pods", type=int, nargs="+", default=[PODS], help="pod counts (2 containers per pod)")
    p.add_argument("--steady", type=float, default=20.0, help="seconds of the steady window")
    p.add_argument("--churn", type=float, default=20.0, help="seconds of the churn window")
    p.add_argument("--json", default="", help="also write every run's figures to this file")
    p.add_argument(
        "--step-clock",
        choices=("cpu", "wall", "off"),
        default="cpu",
        help="time loop steps by CPU or wall time (or not)",
    )
    p.add_argument(
        "--event-loop",
        default="",
        help="the agent's --event-loop (default: its own; uvloop is probed, unnamed)",
    )
    p.add_argument(
        "--step-stacks",
        action="store_true",
        help="sample where long steps spend their time (stdlib loop; perturbs: a diagnosis, not figures)",
    )
    p.add_argument(
        "--agent-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the agent's environment (e.g. KOORDQOS_GC_POLICY=build); repeatable",
    )
    p.add_argument("--profile", default="", help="py-spy each window into PREFIX-<pods>-<window>.txt (raw)")
    p.add_argument(
        "--reporting",
        choices=("on", "off"),
        default="on",
        help="NodeMetric and NRT reports (on: a NodeMetric with a 30 s report interval exists)",
    )
    args = p.parse_args()
    steady_s, churn_s = (6.0, 6.0) if args.quick else (args.steady, args.churn)
    runs = 1 if args.quick else args.runs
    everything: list[dict[str, Any]] = []
    rows = []
    for pods in args.pods:
        results = []
        for i in range(runs):
            with tempfile.TemporaryDirectory(prefix="koordqos-bench-") as tmp:
                try:
                    r = asyncio.run(
                        one_run(
                            pods,
                            steady_s,
                            churn_s,
                            Path(tmp),
                            args.reporting == "on",
                            args.profile,
                            args.step_clock,
                            args.event_loop,
                            args.step_stacks,
                            tuple(args.agent_env),
                        )
                    )
                except Exception as exc:  # one failed run (e.g. never ready under the load) is reported
                    print(f"# {pods} pods run {i + 1}/{runs} FAILED: {type(exc).__name__}: {exc}", flush=True)
                    continue
            results.append(r)
            everything.append(r)
            if args.json:  # after every run: a later failure keeps what was measured
                Path(args.json).write_text(json.dumps(everything, indent=1))
            load = r["load"]
            worst = max((r["steady"], r["churn"]), key=lambda w: w["longest_ms"])
            print(
                f"# {pods} pods run {i + 1}/{runs}: steady {r['steady']['cpu_percent']:.1f} %, "
                f"churn {r['churn']['cpu_percent']:.1f} % ({r['churn']['creates_per_s']:.0f}/s), "
                f"lag p99 ≤ {r['steady']['lag_p99_ms']:g}/{r['churn']['lag_p99_ms']:g} ms, longest step "
                f"{r['steady']['longest_ms']:.1f}/{r['churn']['longest_ms']:.1f} ms "
                f"({worst['step_clock']}; {worst['longest_wall_ms']:.1f} ms wall) [{worst['longest_name']}], "
                f"start-up {r['startup_s']:.1f} s, RSS {r['rss_mib']:.0f} MiB; "
                f"load {load[0][0]:.1f} → {load[1][0]:.1f}; ticks {r['steady']['ticks']:.0f}/"
                f"{r['churn']['ticks']:.0f} ({r['steady']['cpu_ms_per_tick']:.0f}/"
                f"{r['churn']['cpu_ms_per_tick']:.0f} ms CPU per tick); planned pods "
                f"{r['steady']['planned_pods']}/{r['churn']['planned_pods']}; cgroup writes "
                f"{r['steady']['cgroup_writes']}/{r['churn']['cgroup_writes']}"
                + (f"; NRI PLUGIN DROPPED: {r['churn']['dropped']}" if r["churn"]["dropped"] else ""),
                flush=True,
            )
            for w in ("steady", "churn"):
                gc = r[w]["gc"]
                if gc:
                    print(
                        f"#   {w} GC: "
                        + ", ".join(
                            f"gen {g} ×{v[0]:.0f} {v[1]:.1f} ms"
                            + (f" (longest {v[2]:.1f})" if g == "2" else "")
                            for g, v in sorted(gc.items())
                        ),
                        flush=True,
                    )
                for name, (n, ms, wall, in_gc) in r[w]["long_steps"].items():
                    print(
                        f"#   {w} step ≥ {LIST_STEPS_MS:g} ms ×{n:.0f}: longest {ms:.1f} ms "
                        f"({wall:.1f} wall, GC {in_gc:.1f}) {name}",
                        flush=True,
                    )
                    for stack, n_samples in r[w]["stacks"].get(name, []):
                        print(f"#       {n_samples:3d} × {stack}", flush=True)
        if not results:
            continue

        def med(get: Any, rs: list[dict[str, Any]] = results) -> float:
            return median([get(r) for r in rs])

        longest = max(results, key=lambda r: max(r["steady"]["longest_ms"], r["churn"]["longest_ms"]))
        lw = max((longest["steady"], longest["churn"]), key=lambda w: w["longest_ms"])
        rows.append(
            [
                pods,
                f"{med(lambda r: r['steady']['cpu_percent']):.1f} % "
                f"({med(lambda r: r['steady']['cpu_ms_per_tick']):.0f} ms/tick)",
                f"{med(lambda r: r['churn']['cpu_percent']):.1f} % "
                f"({med(lambda r: r['churn']['cpu_ms_per_tick']):.0f} ms/tick; "
                f"{med(lambda r: r['churn']['creates_per_s']):.0f} creates/s)",
                f"{med(lambda r: r['rss_mib']):.0f} MiB",
                f"≤ {med(lambda r: r['steady']['lag_p99_ms']):g} / "
                f"≤ {med(lambda r: r['churn']['lag_p99_ms']):g} ms",
                f"{med(lambda r: r['steady']['longest_ms']):.1f} / "
                f"{med(lambda r: r['churn']['longest_ms']):.1f} ms "
                f"(max {lw['longest_ms']:.1f}, {lw['longest_wall_ms']:.0f} wall: {lw['longest_name']})",
                f"{med(lambda r: r['startup_s']):.1f} s",
                f"{med(lambda r: r['load'][0][0]):.1f}–{med(lambda r: r['load'][1][0]):.1f}",
            ]
        )
    print(
        f"machine: {machine()}; {runs} run(s) per size, median; windows {steady_s:.0f} s steady + "
        f"{churn_s:.0f} s churn; reporting {args.reporting}"
    )
    print(
        table(
            rows,
            [
                "pods",
                "CPU steady",
                "CPU churn",
                "RSS",
                "lag p99 steady / churn",
                f"longest step steady / churn ({args.step_clock} time)",
                "start-up → /readyz",
                "load avg",
            ],
        )
    )


if __name__ == "__main__":
    main()
