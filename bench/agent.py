"""The whole agent at 200 pods: event-loop lag, resident memory and CPU while watched, ticked and hooked.

The agent runs as a real subprocess (`python -m koordqos run`) against a synthetic node: a fake Kubernetes
API server with 200 pods (half LS, half BE with batch resources) and an enabled NodeSLO, a synthetic
cgroup/proc/sys tree whose counters advance, and a mock NRI runtime that synchronises 200 pods / 400
containers and then sends CreateContainer calls throughout the measurement.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from _common import machine, median, parser, table
from koordqos.model.pod import parse_pod
from koordqos.testing.fake_apiserver import FakeAPIServer, make_node, make_nodemetric, make_nodeslo, make_pod
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_pod
from koordqos.testing.nodefs import SyntheticNode

NODE = "bench-node"
PODS = 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    return rss, hwm


def lag_quantile(metrics: str, q: float) -> float:
    """Upper bound of the histogram bucket holding the q-quantile of koordqos_event_loop_lag_seconds."""
    buckets = []
    for m in re.finditer(r'koordqos_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', metrics):
        buckets.append((float(m.group(1)), float(m.group(2))))
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def report_writes(metrics: str, kind: str) -> float:
    """koordqos_report_writes_total{kind, outcome="written"} from a /metrics page (0 when absent)."""
    pattern = rf'koordqos_report_writes_total\{{kind="{kind}",outcome="written"\}} ([0-9.e+]+)'
    m = re.search(pattern, metrics)
    return float(m.group(1)) if m else 0.0


async def one_run(duration: float, workdir: Path, reporting: bool = True) -> dict[str, float]:
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
    nri_pods = [sample_pod(i, "besteffort" if i % 2 else "burstable") for i in range(PODS)]
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
        node.add_pod(parse_pod(raw))
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    sock = workdir / "nri.sock"
    runtime = MockRuntime(sock)
    runtime.pods = nri_pods
    runtime.containers = [sample_container(p, j) for p in nri_pods for j in range(2)]
    await runtime.start()
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "koordqos",
        "run",
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        NODE,
        *node.root_flags(),
        "--nri-socket",
        str(sock),
        "--http-addr",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        "--log-format",
        "json",
    ]
    if not reporting:
        cmd += ["--enable-node-metric-report=false", "--feature-gates=NodeTopologyReport=false"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOORDQOS_")}
    errlog = open(os.environ.get("BENCH_AGENT_STDERR", os.devnull), "w")  # noqa: SIM115
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, stderr=errlog)
    result: dict[str, float] = {}
    try:
        await runtime.wait_joined(timeout=60)
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("agent never became ready")
                await asyncio.sleep(0.1)
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                before = await r.text()
            cpu0 = proc_cpu_seconds(proc.pid)
            t0 = time.monotonic()
            calls = 0
            # the load for `duration` s; with reporting, until the first NodeMetric status is written too
            # (the first report comes one 30 s interval after start), so every run includes report rounds
            limit = duration + (60.0 if reporting else 0.0)
            after = ""
            while True:
                elapsed = time.monotonic() - t0
                if elapsed >= duration:
                    async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                        after = await r.text()
                    if not reporting or report_writes(after, "NodeMetric") >= 1 or elapsed >= limit:
                        break
                node.advance_node_cpu(busy_ticks=300, idle_ticks=500)
                for sp in nri_pods[:20]:
                    await runtime.create_container(sp, sample_container(sp, 9 + calls % 5))
                    calls += 1
                await asyncio.sleep(0.5)
            elapsed = time.monotonic() - t0
            cpu = proc_cpu_seconds(proc.pid) - cpu0
        rss, hwm = proc_memory(proc.pid)
        result = {
            "lag_p99_ms": lag_quantile(after, 0.99) * 1000,
            "lag_p50_ms": lag_quantile(after, 0.50) * 1000,
            "rss_mib": rss / 2**20,
            "hwm_mib": hwm / 2**20,
            "cpu_percent": 100 * cpu / elapsed,
            "creates_per_s": calls / elapsed,
            "nodemetric_writes": report_writes(after, "NodeMetric"),
            "nrt_writes": report_writes(after, "NodeResourceTopology"),
            "elapsed_s": elapsed,
        }
        del before
        proc.send_signal(signal.SIGTERM)
        t_stop = time.monotonic()
        rc = await asyncio.wait_for(proc.wait(), 10)
        result["stop_s"] = time.monotonic() - t_stop
        result["rc"] = rc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runtime.stop()
        await api.stop()
    return result


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument(
        "--reporting",
        choices=("on", "off"),
        default="on",
        help="NodeMetric and NRT reports (on: a NodeMetric exists and the run lasts until one is written)",
    )
    args = p.parse_args()
    duration = 6.0 if args.quick else 30.0
    runs = 1 if args.quick else min(args.runs, 3)
    results = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="koordqos-bench-") as tmp:
            results.append(asyncio.run(one_run(duration, Path(tmp), args.reporting == "on")))

    def med(key: str) -> float:
        return median([r[key] for r in results])

    print(f"machine: {machine()}; {runs} run(s) of {duration:.0f} s, median; {PODS} pods, {2 * PODS} ctrs")
    print(
        table(
            [
                ["event-loop lag p50 (histogram bucket)", f"≤ {med('lag_p50_ms'):g} ms"],
                ["event-loop lag p99 (histogram bucket)", f"≤ {med('lag_p99_ms'):g} ms"],
                ["resident memory at the end (VmRSS)", f"{med('rss_mib'):.0f} MiB"],
                ["peak resident memory (VmHWM)", f"{med('hwm_mib'):.0f} MiB"],
                ["agent CPU (1 s ticks, 4 strategies, hooks)", f"{med('cpu_percent'):.1f} % of one core"],
                ["CreateContainer calls driven", f"{med('creates_per_s'):.0f} /s"],
                ["measured for", f"{med('elapsed_s'):.0f} s (reporting {args.reporting})"],
                ["NodeMetric / NRT writes", f"{med('nodemetric_writes'):.0f} / {med('nrt_writes'):.0f}"],
                ["SIGTERM → exit", f"{med('stop_s'):.2f} s (exit code {int(med('rc'))})"],
            ],
            ["measure", "value"],
        )
    )


if __name__ == "__main__":
    main()
