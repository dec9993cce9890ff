"""Runtime hooks: NRI CreateContainer with every hook enabled, plugin-side p50/p99, and Synchronize of a
200-pod / 400-container node with the hooks correcting every BE container.

The plugin (this process) runs NRIPlugin with the runtime hooks of koordqos (BatchResource, CPUNormalization,
CPUSetAllocator, CoreSched, GroupIdentity, OOMScoreAdj; `RuntimeHooks` + `nri.convert.NRIHooks`) over a
synthetic cgroup tree. The runtime (a child process: this script with `--role runtime`) is the mock NRI
runtime; it synchronizes the node, then sends CreateContainer calls for a BE pod with batch resources.

`--yardstick` also runs the same mock runtime against `tests/go/stubplugin` (a compiled plugin on
containerd/nri's pkg/stub filling the same batch shares / quota / memory limit; needs Go): the round trip a
compiled plugin gets through this runtime process on this machine, beside koordqos's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    ALL_HOOK_GATES,
    BATCH_EXTENDED_RESOURCE_SPEC,
    add_busy_poll,
    idle_spinners,
    machine,
    median,
    percentile,
    plugin_settings,
    quiet_logs,
    run,
    table,
    two_process_parser,
)
from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.config import NRISettings
from koordqos.decisions import DecisionLog
from koordqos.features import DEFAULT_GATES
from koordqos.hooks import probe_bvt_system
from koordqos.hooks.core import HookCore
from koordqos.hooks.runtime import HookOptions, RuntimeHooks
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.busypoll import SpareCPU
from koordqos.nri.connection import NRIConnection
from koordqos.nri.convert import NRIHooks
from koordqos.nri.mux import frames_for
from koordqos.nri.plugin import NRIPlugin
from koordqos.nri.session import PLUGIN_SERVICE, PluginSession
from koordqos.nri.telemetry import BUSY_POLL_WINDOWS
from koordqos.nri.ttrpc import MessageType, encode_message, encode_request
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_container, sample_node, sample_pod
from koordqos.testing.nodefs import SyntheticNode
from tests.support.gopeer import GoUnavailable, build

REPO = Path(__file__).resolve().parents[1]


def be(pod: api.PodSandbox) -> api.PodSandbox:
    """Make a sample pod a BE pod with batch resources and an oom-score-adj annotation."""
    pod.labels["koordinator.sh/qosClass"] = "BE"
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = BATCH_EXTENDED_RESOURCE_SPEC
    pod.annotations["koordinator.sh/oom-score-adj"] = "500"
    return pod


def spin_until_done(fut: asyncio.Future[Any], until: float) -> None:
    """Keep the loop turning (its poll then never sleeps) until `fut` is done or `until` (perf_counter):
    a runtime that spins while it waits for the reply, as a Go runtime's threads spin a little before they
    park, so that its own wake-up is not in the round trip (`--runtime-spin`)."""
    if not fut.done() and time.perf_counter() < until:
        asyncio.get_running_loop().call_soon(spin_until_done, fut, until)


async def runtime_role(
    sock: str, calls: int, pods: int, per_pod: int, plugin: str = "koordqos", spin: float = 0.0
) -> None:
    """The mock runtime side: sync, then `calls` CreateContainer round trips; JSON on stdout. `plugin`
    "stub": the Go yardstick, which sets no oom-score-adj. `spin` > 0: spin up to that long for each reply."""
    rt = MockRuntime(sock, request_timeout=2.0)
    rt.pods, rt.containers = sample_node(pods, per_pod)
    for p in rt.pods:
        be(p)
    async with rt:
        print("ready", flush=True)
        link = await rt.wait_joined(timeout=30)
        pod = be(sample_pod(pods + 1))
        ctrs = [sample_container(pod, j, api.CONTAINER_CREATED) for j in range(16)]
        rtts = []
        for i in range(calls):
            t0 = time.perf_counter()
            if spin > 0:
                call = asyncio.ensure_future(rt.create_container(pod, ctrs[i % len(ctrs)]))
                spin_until_done(call, t0 + spin)
                resp = await call
            else:
                resp = await rt.create_container(pod, ctrs[i % len(ctrs)])
            rtts.append(time.perf_counter() - t0)
            assert resp is not None
            res = resp.adjust.linux.resources
            assert (res.cpu.quota.value, res.cpu.shares.value) == (200000, 1024), res
            assert plugin == "stub" or resp.adjust.linux.oom_score_adj.value == 500
        dropped = link.drop_reason
        sync_updates = len(link.sync_updates)
    print(
        json.dumps(
            {"sync_s": link.sync_seconds, "rtt": rtts, "dropped": dropped, "sync_updates": sync_updates}
        ),
        flush=True,
    )


def runtime_hooks(node: SyntheticNode) -> RuntimeHooks:
    """All six runtime hooks over a synthetic node."""
    gates = dict(DEFAULT_GATES) | dict.fromkeys(ALL_HOOK_GATES, True)
    hooks = RuntimeHooks(
        HookOptions(
            gates=gates,
            bvt=probe_bvt_system(node.layout, node.proc_root),
            core_sched_supported=False,
            core_sched_reason="bench",
        )
    )
    assert sorted(hooks.names) == sorted(ALL_HOOK_GATES), hooks.names
    return hooks


def runtime_cmd(
    sock: Path, calls: int, pods: int, per_pod: int, loop: str, plugin: str = "koordqos", spin: float = 0.0
) -> list[str]:
    """The command of the runtime process (this script in the runtime role) for `plugin`."""
    return [
        *(sys.executable, __file__, "--role", "runtime", "--socket", str(sock), "--calls", str(calls)),
        *("--pods", str(pods), "--per-pod", str(per_pod), "--loop", loop, "--plugin", plugin),
        *("--runtime-spin", str(spin)),
    ]


async def one_run(
    calls: int,
    pods: int,
    per_pod: int,
    loop: str = "asyncio",
    busy_poll: float | None = None,
    spin: float = 0.0,
) -> dict[str, float]:
    """One plugin + runtime-process run; returns the figures of this run."""
    tmp = Path(tempfile.mkdtemp(prefix="kqhbench-", dir="/tmp"))
    sock = tmp / "nri.sock"
    node = SyntheticNode(tmp / "node", extensions=("cpu.bvt_warp_ns", "cpu.idle"))
    cmd = runtime_cmd(sock, calls, pods, per_pod, loop, spin=spin)
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    windows0 = busy_poll_windows()
    try:
        assert (await proc.stdout.readline()).strip() == b"ready"
        bus = EventBus()
        decisions = DecisionLog()
        core = HookCore(runtime_hooks(node), CgroupExecutor(node.layout, decisions), decisions)
        plugin = NRIPlugin(
            bus,
            plugin_settings(sock, busy_poll),
            handler=NRIHooks(core, node.layout),
            busy_poll_gate=SpareCPU(Path("/proc/stat")),  # as the agent's (build_plugin), on this machine
        )
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
    if out["sync_updates"] != pods * per_pod:
        raise SystemExit(f"Synchronize corrected {out['sync_updates']} of {pods * per_pod} containers")
    create = plugin.timings["CreateContainer"]
    rtt = out["rtt"]
    windows = {f"windows_{k}": v - windows0[k] for k, v in busy_poll_windows().items()}
    return {
        "rtt_p50": percentile(rtt, 50) * 1e6,
        "rtt_p99": percentile(rtt, 99) * 1e6,
        "plugin_p50": percentile(create, 50) * 1e6,
        "plugin_p99": percentile(create, 99) * 1e6,
        "sync_plugin_ms": sum(plugin.timings["Synchronize"]) * 1e3,
        **windows,
    }


def busy_poll_windows() -> dict[str, float]:
    """The plugin's busy-poll windows so far by outcome (caught, expired, skipped): this process's counter."""
    return {k: BUSY_POLL_WINDOWS.labels(k).get() for k in ("caught", "expired", "skipped")}


def stub_run(
    stub: Path, calls: int, pods: int, per_pod: int, loop: str, spin: float = 0.0
) -> dict[str, float]:
    """The same mock runtime process against the compiled Go plugin: its round trip p50/p99 (µs)."""
    tmp = Path(tempfile.mkdtemp(prefix="kqhstub-", dir="/tmp"))
    sock = tmp / "nri.sock"
    rt = subprocess.Popen(runtime_cmd(sock, calls, pods, per_pod, loop, "stub", spin), stdout=subprocess.PIPE)
    plugin: subprocess.Popen[bytes] | None = None
    assert rt.stdout is not None
    try:
        assert rt.stdout.readline().strip() == b"ready"
        plugin = subprocess.Popen(
            [str(stub), "-socket", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        out = json.loads(rt.stdout.readline())
        rt.wait(timeout=30)
    finally:
        for p in (rt, plugin):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    rtt = out["rtt"]
    return {"rtt_p50": percentile(rtt, 50) * 1e6, "rtt_p99": percentile(rtt, 99) * 1e6}


class _Sink:
    """A transport that keeps nothing: the in-process run reads the reply's arrival from it."""

    def __init__(self) -> None:
        self.replied: asyncio.Future[None] | None = None

    def writelines(self, frames: object) -> None:
        if self.replied is not None and not self.replied.done():
            self.replied.set_result(None)

    def write(self, data: bytes) -> None:
        self.writelines(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...

    def abort(self) -> None: ...


class InProcessPlugin:
    """The plugin with the six hooks, no socket: a request's bytes fed to its connection (`data_received`)
    until the reply is written. `plugin.timings` holds the plugin-side times. Use within `with`."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="kqhcpu-", dir="/tmp"))
        try:
            node = SyntheticNode(self.tmp / "node", extensions=("cpu.bvt_warp_ns", "cpu.idle"))
            decisions = DecisionLog()
            core = HookCore(runtime_hooks(node), CgroupExecutor(node.layout, decisions), decisions)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        self.plugin = NRIPlugin(
            EventBus(), NRISettings(socket=self.tmp / "s"), handler=NRIHooks(core, node.layout)
        )
        self.plugin.timings = {}
        session = PluginSession(self.plugin)
        self.conn = NRIConnection(session.handle)
        self.sink = _Sink()
        self.conn._transport = self.sink  # type: ignore[assignment]  # (not connection_made: older code asserted the type)
        self.stream = 1

    def __enter__(self) -> InProcessPlugin:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    async def call(self, method: str, payload: bytes) -> None:
        """One request through the connection, until its reply is written."""
        env = encode_request(PLUGIN_SERVICE, method, payload, 2_000_000_000)
        data = b"".join(frames_for(1, encode_message(self.stream, MessageType.REQUEST, env)))
        self.stream += 2
        self.sink.replied = asyncio.get_running_loop().create_future()
        self.conn.data_received(data)
        await self.sink.replied

    async def synchronize(self, pods: int, per_pod: int) -> list[bytes]:
        """Synchronize a node of `pods` BE pods; the payloads of 16 CreateContainer calls of a new BE pod."""
        sync_pods, sync_ctrs = sample_node(pods, per_pod)
        for p in sync_pods:
            be(p)
        await self.call(
            "Synchronize", api.SynchronizeRequest(pods=sync_pods, containers=sync_ctrs).SerializeToString()
        )
        pod = be(sample_pod(pods + 1))
        return [
            api.CreateContainerRequest(
                pod=pod, container=sample_container(pod, j, api.CONTAINER_CREATED)
            ).SerializeToString()
            for j in range(16)
        ]


async def in_process_cpu(calls: int, pods: int, per_pod: int) -> dict[str, float]:
    """Plugin CPU per CreateContainer without sockets (`InProcessPlugin`), after a Synchronize of `pods` ×
    `per_pod`; the loop thread's CPU time per call over batches of 250 calls (medians), which a loaded
    machine inflates far less than wall-clock figures."""
    with InProcessPlugin() as ip:
        payloads = await ip.synchronize(pods, per_pod)
        per_call: list[float] = []
        for batch in range(calls // 250):
            c0 = time.thread_time()
            for i in range(250):
                await ip.call("CreateContainer", payloads[i % 16])
            if batch:  # the first batch warms up
                per_call.append((time.thread_time() - c0) / 250)
    return {"cpu_us": median(per_call) * 1e6, "cpu_min_us": min(per_call) * 1e6}


def main() -> None:
    """Parse flags and run (or play the runtime role)."""
    p = two_process_parser(__doc__.splitlines()[0], ("plugin", "runtime"))
    add_busy_poll(p)
    p.add_argument("--pods", type=int, default=200)
    p.add_argument("--per-pod", type=int, default=2)
    p.add_argument("--plugin", choices=["koordqos", "stub"], default="koordqos", help=argparse.SUPPRESS)
    p.add_argument(
        "--in-process-only",
        type=int,
        metavar="CALLS",
        help="run only the in-process calls (a Synchronize, then CALLS CreateContainer) and exit: for "
        "`valgrind --tool=callgrind` at two counts, whose difference is the instructions of the calls",
    )
    p.add_argument(
        "--keep-cpus-busy",
        action="store_true",
        help="one SCHED_IDLE spinner per CPU during the socket runs: no CPU idles (see bench/wakeup.py)",
    )
    p.add_argument(
        "--yardstick",
        action="store_true",
        help="also the compiled Go plugin (tests/go/stubplugin) through the same mock runtime (needs Go)",
    )
    p.add_argument(
        "--runtime-spin",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the mock runtime spins up to this long for each reply instead of sleeping (as a Go runtime's"
        " threads spin before they park): the round trip without the runtime's own wake-up",
    )
    args = p.parse_args()
    if args.role == "runtime":
        run(
            runtime_role(args.socket, args.calls, args.pods, args.per_pod, args.plugin, args.runtime_spin),
            args.loop,
        )
        return
    quiet_logs()
    if args.in_process_only is not None:
        run(in_process_cpu(args.in_process_only, args.pods, args.per_pod), args.loop)
        return
    calls = 200 if args.quick else args.calls
    runs = 1 if args.quick else args.runs
    with idle_spinners(args.keep_cpus_busy):
        results = [
            run(
                one_run(calls, args.pods, args.per_pod, args.loop, args.busy_poll, args.runtime_spin),
                args.loop,
            )
            for _ in range(runs)
        ]
    cpu = [run(in_process_cpu(max(calls, 1000), args.pods, args.per_pod), args.loop) for _ in range(runs)]
    for r, c in zip(results, cpu, strict=True):
        r.update(c)
    med = {k: median([r[k] for r in results]) for k in results[0]}
    yardstick: list[list[str]] = []
    if args.yardstick:
        try:
            stub = build(REPO / "tests" / "go" / "stubplugin")
        except GoUnavailable as exc:
            print(f"yardstick skipped: {exc}")
        else:
            with idle_spinners(args.keep_cpus_busy):
                go = [
                    stub_run(stub, calls, args.pods, args.per_pod, args.loop, args.runtime_spin)
                    for _ in range(runs)
                ]
            p50, p99 = median([g["rtt_p50"] for g in go]), median([g["rtt_p99"] for g in go])
            yardstick = [
                [
                    "CreateContainer round trip p50 / p99, the compiled Go plugin (pkg/stub), same runtime",
                    f"{p50:.0f} / {p99:.0f} µs",
                    "",
                ],
                ["koordqos / Go plugin round trip p50", f"{med['rtt_p50'] / p50:.2f}×", ""],
            ]
    n_ctr = args.pods * args.per_pod
    print(
        f"Runtime hooks benchmark — {machine()}; {calls} CreateContainer calls, all six hooks, "
        f"median of {runs} run(s), {args.loop} loop"
        + ("; CPUs kept busy (idle-priority spinners)" if args.keep_cpus_busy else "")
        + (
            f"; the runtime spins up to {args.runtime_spin * 1e6:.0f} µs per reply"
            if args.runtime_spin
            else ""
        )
        + "; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print(
        table(
            [
                [
                    "CreateContainer plugin-side p50 / p99 (all hooks)",
                    f"{med['plugin_p50']:.0f} / {med['plugin_p99']:.0f} µs",
                    "p99 ≤ 300 µs",
                ],
                [
                    "CreateContainer round trip p50 / p99 (runtime process)",
                    f"{med['rtt_p50']:.0f} / {med['rtt_p99']:.0f} µs",
                    "",
                ],
                *yardstick,
                [
                    "busy-poll windows after a reply: caught / expired / skipped (medians of runs)",
                    " / ".join(f"{med['windows_' + k]:.0f}" for k in ("caught", "expired", "skipped")),
                    "",
                ],
                [
                    "CreateContainer plugin CPU per call, in process (loop-thread CPU; best batch)",
                    f"{med['cpu_us']:.0f} µs ({med['cpu_min_us']:.0f})",
                    "",
                ],
                [
                    f"Synchronize {args.pods} pods / {n_ctr} containers (all corrected), plugin time",
                    f"{med['sync_plugin_ms']:.1f} ms",
                    "≤ 150 ms",
                ],
            ],
            ["measure", "value", "budget"],
        )
    )


if __name__ == "__main__":
    main()
