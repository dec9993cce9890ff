"""NRI: CreateContainer round trip through a real unix socket with the mock runtime in another process,
plugin-side CreateContainer time, and a 200-pod / 400-container Synchronize.

The plugin (this process) runs NRIPlugin with one representative handler (cpu shares + quota, an annotation
and an env var in the adjustment). The runtime (a child process: this script with `--role runtime`) is
koordqos.testing.mock_nri.runtime.MockRuntime; it synchronizes the node, then sends CreateContainer calls one
after another, timing each round trip, and prints its figures as JSON.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine, median, percentile, quiet_logs, table, two_process_parser
from koordqos.config import NRISettings
from koordqos.events.bus import EventBus
from koordqos.nri.events import NRICall, NRICreateContainer
from koordqos.nri.plugin import NRIPlugin
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_node, sample_pod


def _hook(ev: NRICall, state: Any, call: Any) -> None:
    if not isinstance(ev, NRICreateContainer):
        return
    res = ev.adjust.linux.resources
    res.cpu.shares.value = 2
    res.cpu.quota.value = -1
    ev.adjust.annotations["koordqos.io/hooked"] = "true"
    ev.adjust.env.add(key="KOORDQOS_QOS", value="BE")


async def runtime_role(sock: str, calls: int, pods: int, per_pod: int) -> None:
    """The mock runtime side: sync, then `calls` CreateContainer round trips; JSON on stdout."""
    rt = MockRuntime(sock, request_timeout=2.0)
    rt.pods, rt.containers = sample_node(pods, per_pod)
    async with rt:
        print("ready", flush=True)
        link = await rt.wait_joined(timeout=30)
        pod = sample_pod(pods + 1)
        ctrs = [sample_container(pod, j) for j in range(16)]
        rtts = []
        for i in range(calls):
            t0 = time.perf_counter()
            resp = await rt.create_container(pod, ctrs[i % len(ctrs)])
            rtts.append(time.perf_counter() - t0)
            assert resp is not None
            assert resp.adjust.linux.resources.cpu.shares.value == 2
        dropped = link.drop_reason
    print(json.dumps({"sync_s": link.sync_seconds, "rtt": rtts, "dropped": dropped}), flush=True)


async def one_run(calls: int, pods: int, per_pod: int) -> dict[str, float]:
    """One plugin + runtime-process run; returns the figures of this run."""
    tmp = Path(tempfile.mkdtemp(prefix="kqbench-", dir="/tmp"))
    sock = tmp / "nri.sock"
    cmd = [
        sys.executable,
        __file__,
        "--role",
        "runtime",
        "--socket",
        str(sock),
        "--calls",
        str(calls),
        "--pods",
        str(pods),
        "--per-pod",
        str(per_pod),
    ]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert (await proc.stdout.readline()).strip() == b"ready"
        bus = EventBus()
        plugin = NRIPlugin(bus, NRISettings(socket=sock), handler=_hook)
        plugin.timings = {}
        task = asyncio.create_task(plugin.run())
        out = json.loads(await proc.stdout.readline())
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if out["dropped"] not in ("", "plugin closed the connection"):
        raise SystemExit(f"the runtime dropped the plugin: {out['dropped']}")
    create = plugin.timings["CreateContainer"]
    rtt = out["rtt"]
    return {
        "rtt_p50": percentile(rtt, 50) * 1e6,
        "rtt_p90": percentile(rtt, 90) * 1e6,
        "rtt_p99": percentile(rtt, 99) * 1e6,
        "plugin_p50": percentile(create, 50) * 1e6,
        "plugin_p99": percentile(create, 99) * 1e6,
        "sync_plugin_ms": sum(plugin.timings["Synchronize"]) * 1e3,
        "sync_runtime_ms": out["sync_s"] * 1e3,
    }


def main() -> None:
    """Parse flags and run (or play the runtime role)."""
    p = two_process_parser(__doc__.splitlines()[0], ("plugin", "runtime"))
    p.add_argument("--pods", type=int, default=200)
    p.add_argument("--per-pod", type=int, default=2)
    args = p.parse_args()
    if args.role == "runtime":
        asyncio.run(runtime_role(args.socket, args.calls, args.pods, args.per_pod))
        return
    quiet_logs()
    calls = 200 if args.quick else args.calls
    runs = 1 if args.quick else args.runs
    results = [asyncio.run(one_run(calls, args.pods, args.per_pod)) for _ in range(runs)]
    med = {k: median([r[k] for r in results]) for k in results[0]}
    n_ctr = args.pods * args.per_pod
    print(f"NRI benchmark — {machine()}; {calls} CreateContainer calls, median of {runs} run(s)")
    print(
        table(
            [
                [
                    "CreateContainer round trip p50 / p90 / p99 (runtime process)",
                    f"{med['rtt_p50']:.0f} / {med['rtt_p90']:.0f} / {med['rtt_p99']:.0f} µs",
                    "",
                ],
                [
                    "CreateContainer plugin-side p50 / p99",
                    f"{med['plugin_p50']:.0f} / {med['plugin_p99']:.0f} µs",
                    "p99 ≤ 300 µs",
                ],
                [
                    f"Synchronize {args.pods} pods / {n_ctr} containers, plugin time",
                    f"{med['sync_plugin_ms']:.1f} ms",
                    "≤ 150 ms",
                ],
                [
                    f"Synchronize {args.pods} pods / {n_ctr} containers, runtime wall time",
                    f"{med['sync_runtime_ms']:.1f} ms",
                    "",
                ],
            ],
            ["measure", "value", "budget"],
        )
    )


if __name__ == "__main__":
    main()
