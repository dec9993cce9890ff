"""NRI: CreateContainer round trip through a real unix socket with the mock runtime in another process,
plugin-side CreateContainer time, a 200-pod / 400-container Synchronize, and the event after a large sync.

Scenario `create`: the plugin (this process) runs NRIPlugin with one representative handler (cpu shares +
quota, an annotation and an env var in the adjustment). The runtime (a child process: this script with
`--role runtime`) is koordqos.testing.mock_nri.runtime.MockRuntime; it synchronizes the node, then sends
CreateContainer calls one after another, timing each round trip, and prints its figures as JSON.

Scenario `sync`: the plugin runs the six runtime hooks (as bench/hooks.py) and the local-mode pod source on
a running bus; the runtime synchronizes `--sync-pods` BE pods with `--sync-per-pod` containers each (50 ×
50 = 2,500 containers, ≈ 2.8 MB, by default) and sends RunPodSandbox the moment the last Synchronize reply
is in, then a few CreateContainer. Reported: how long that RunPodSandbox waited (round trip in the runtime
process; plugin-side), and the longest event-loop step of the plugin from the first Synchronize chunk to the
end (every callback timed on the stdlib loop; a 1 ms probe timer's worst lateness on any loop).
"""

from __future__ import annotations

import asyncio
import gc
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
    BATCH_EXTENDED_RESOURCE_SPEC,
    add_busy_poll,
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
from koordqos.config import NRISettings
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import NRICall, NRICreateContainer
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


async def one_run(
    calls: int, pods: int, per_pod: int, loop: str = "asyncio", busy_poll: float | None = None
) -> dict[str, float]:
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
        "--loop",
        loop,
    ]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert (await proc.stdout.readline()).strip() == b"ready"
        bus = EventBus()
        plugin = NRIPlugin(bus, plugin_settings(sock, busy_poll), handler=_hook)
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


# -- scenario `sync`: the event right after a large Synchronize ----------------------------------------


def batch_spec(containers: int) -> str:
    """An extended-resource-spec giving batch resources to containers `c0`…`c<containers-1>`."""
    one = json.loads(BATCH_EXTENDED_RESOURCE_SPEC)["containers"]["c0"]
    return json.dumps({"containers": {f"c{j}": one for j in range(containers)}})


def be(pod: api.PodSandbox, containers: int = 16) -> api.PodSandbox:
    """A sample pod made a BE pod with batch resources (the hooks correct its containers)."""
    pod.labels["koordinator.sh/qosClass"] = "BE"
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = batch_spec(containers)
    return pod


async def sync_runtime_role(sock: str, pods: int, per_pod: int) -> None:
    """Synchronize a large node, then RunPodSandbox at once and a few CreateContainer; JSON on stdout.

    The request timeout is 10 s (containerd's is 2 s) so that a loaded machine measures the slicing, not
    a Synchronize cut short at its deadline (the hooks then stop and the reconciler corrects the rest)."""
    rt = MockRuntime(sock, request_timeout=10.0)
    rt.pods, rt.containers = sample_node(pods, per_pod)
    for p in rt.pods:
        be(p, per_pod)
    size = api.SynchronizeRequest(pods=rt.pods, containers=rt.containers).ByteSize()
    async with rt:
        print("ready", flush=True)
        link = await rt.wait_joined(timeout=120)  # returns once the last Synchronize reply is in
        new = be(sample_pod(pods + 1))
        t0 = time.perf_counter()
        await rt.run_pod_sandbox(new)
        run_rtt = time.perf_counter() - t0
        rtts = []
        for j in range(20):
            t0 = time.perf_counter()
            await rt.create_container(new, sample_container(new, j % 16, api.CONTAINER_CREATED))
            rtts.append(time.perf_counter() - t0)
        out = {
            "sync_s": link.sync_seconds,
            "chunks": link.sync_chunks,
            "bytes": size,
            "updates": len(link.sync_updates),
            "run_rtt": run_rtt,
            "create_rtt": rtts,
            "dropped": link.drop_reason,
        }
    print(json.dumps(out), flush=True)


def _step_name(handle: asyncio.events.Handle) -> str:
    """What a loop step ran: the task's coroutine and where it stopped, or the callback."""
    task = getattr(handle._callback, "__self__", None)  # type: ignore[attr-defined]
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        chain = []  # the coroutines the step resumes, outermost first
        inner: Any = coro
        while inner is not None and getattr(inner, "cr_frame", None) is not None:
            chain.append(f"{inner.cr_frame.f_code.co_name}:{inner.cr_frame.f_lineno}")
            inner = getattr(inner, "cr_await", None)
        where = f" (resuming at {' > '.join(chain)})" if chain else ""
        return f"task {task.get_name()}: {getattr(coro, '__qualname__', coro)}{where}"
    return repr(handle)[:200]


SLOW_STEP = 0.0025  # steps of more CPU than this are listed (`--slow-steps`)


class StepTimer:
    """The plugin's event-loop steps: every callback timed (stdlib loop), and a 1 ms probe's lateness."""

    def __init__(self) -> None:
        self.since = float("inf")  # perf_counter from which steps count (the first Synchronize chunk)
        self.longest = 0.0
        self.longest_cpu = 0.0
        self.longest_what = ""
        self.probe_late = 0.0
        self.gc_longest = 0.0
        self.gc_gen = -1
        self._gc_t0 = 0.0
        self._gc_in_step = 0.0
        self.longest_own = 0.0
        self.longest_own_what = ""
        self.slow: list[tuple[float, str]] = []  # (CPU seconds, what) of every step over SLOW_STEP
        self._orig: Any = None

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif time.perf_counter() >= self.since:
            took = time.perf_counter() - self._gc_t0
            self._gc_in_step += took
            if took > self.gc_longest:
                self.gc_longest, self.gc_gen = took, info.get("generation", -1)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        gc.callbacks.append(self._gc)
        if isinstance(loop, asyncio.BaseEventLoop):
            timer = self
            orig = self._orig = asyncio.events.Handle._run
            cpu = time.thread_time  # CPU time of the loop thread: a step's own work, not the preemption

            def run(handle: asyncio.events.Handle) -> None:
                if not t_active():
                    orig(handle)
                    return
                before = _step_name(handle)
                timer._gc_in_step = 0.0
                c0 = cpu()
                t0 = time.perf_counter()
                orig(handle)
                took = time.perf_counter() - t0
                used = cpu() - c0
                own = used - timer._gc_in_step  # the step's CPU less the collections that ran inside it
                if own > timer.longest_own:
                    timer.longest_own = own
                    timer.longest_own_what = before
                timer.longest = max(timer.longest, took)
                if used > timer.longest_cpu:
                    timer.longest_cpu = used
                    timer.longest_what = before
                if used > SLOW_STEP:
                    timer.slow.append((used, before))

            def t_active() -> bool:
                return time.perf_counter() >= timer.since

            asyncio.events.Handle._run = run  # type: ignore[method-assign]
        self._probe(loop, loop.time() + 0.001)

    def _probe(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        late = loop.time() - due
        if time.perf_counter() >= self.since:
            self.probe_late = max(self.probe_late, late)
        loop.call_at(loop.time() + 0.001, self._probe, loop, loop.time() + 0.001)

    def uninstall(self) -> None:
        gc.callbacks.remove(self._gc)
        if self._orig is not None:
            asyncio.events.Handle._run = self._orig  # type: ignore[method-assign]


async def sync_run(pods: int, per_pod: int, loop_name: str = "asyncio") -> dict[str, Any]:
    """One plugin (six hooks, local pod source, running bus) + runtime-process run of the sync scenario."""
    from hooks import runtime_hooks  # the same six-hook set as bench/hooks.py
    from koordqos.cgroups.executor import CgroupExecutor
    from koordqos.config import build_config
    from koordqos.decisions import DecisionLog
    from koordqos.hooks.core import HookCore
    from koordqos.localsources import LocalSources
    from koordqos.nri.convert import NRIHooks
    from koordqos.testing.nodefs import SyntheticNode

    tmp = Path(tempfile.mkdtemp(prefix="kqsbench-", dir="/tmp"))
    sock = tmp / "nri.sock"
    node = SyntheticNode(tmp / "node", extensions=("cpu.bvt_warp_ns", "cpu.idle"))
    cmd = [sys.executable, __file__, "--role", "sync-runtime", "--socket", str(sock)]
    cmd += ["--sync-pods", str(pods), "--sync-per-pod", str(per_pod), "--loop", loop_name]
    steps = StepTimer()
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert (await proc.stdout.readline()).strip() == b"ready"
        bus = EventBus()
        decisions = DecisionLog()
        core = HookCore(runtime_hooks(node), CgroupExecutor(node.layout, decisions), decisions)
        plugin = NRIPlugin(bus, NRISettings(socket=sock), handler=NRIHooks(core, node.layout))
        LocalSources(bus, build_config({"kube": {"node_name": "bench"}}), node.layout)
        plugin.timings = {}
        gc.collect()
        gc.freeze()  # as the agent does once it is built: start-up objects stay out of every collection
        session_handle_seen = False

        def first_sync() -> None:  # the window opens when the first chunk reaches the plugin
            nonlocal session_handle_seen
            if not session_handle_seen and plugin.session is not None and plugin.session.configured.is_set():
                session_handle_seen = True
                steps.since = time.perf_counter()
            else:
                loop.call_later(0.0005, first_sync)

        loop = asyncio.get_running_loop()
        steps.install(loop)
        loop.call_soon(first_sync)
        tasks = [asyncio.create_task(bus.run()), asyncio.create_task(plugin.run())]
        out = json.loads(await proc.stdout.readline())
        await bus.drained(timeout=60)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await proc.wait()
    finally:
        steps.uninstall()
        gc.unfreeze()
        shutil.rmtree(tmp, ignore_errors=True)
    if out["dropped"] not in ("", "plugin closed the connection"):
        raise SystemExit(f"the runtime dropped the plugin: {out['dropped']}")
    if out["updates"] != pods * per_pod:
        raise SystemExit(f"Synchronize corrected {out['updates']} of {pods * per_pod} containers")
    return {
        "run_rtt_ms": out["run_rtt"] * 1e3,
        "run_plugin_ms": plugin.timings["RunPodSandbox"][0] * 1e3,
        "create_rtt_p50_us": percentile(out["create_rtt"], 50) * 1e6,
        "longest_step_ms": steps.longest * 1e3,
        "longest_cpu_ms": steps.longest_cpu * 1e3,
        "longest_own_ms": steps.longest_own * 1e3,
        "own_what": steps.longest_own_what,
        "probe_late_ms": steps.probe_late * 1e3,
        "gc_ms": steps.gc_longest * 1e3,
        "gc_gen": steps.gc_gen,
        "sync_runtime_ms": out["sync_s"] * 1e3,
        "sync_plugin_ms": sum(plugin.timings["Synchronize"]) * 1e3,
        "chunks": out["chunks"],
        "mb": out["bytes"] / 1e6,
        "what": steps.longest_what,
        "slow_what": sorted(steps.slow, reverse=True),
    }


def sync_main(args: Any) -> None:
    runs = 1 if args.quick else args.runs
    results = [run(sync_run(args.sync_pods, args.sync_per_pod, args.loop), args.loop) for _ in range(runs)]
    med = {k: median([r[k] for r in results]) for k in results[0] if not k.endswith("what")}
    n = args.sync_pods * args.sync_per_pod
    load = os.getloadavg()
    print(
        f"NRI after a large Synchronize — {machine()}; {args.sync_pods} pods / {n} containers "
        f"({med['mb']:.1f} MB in {med['chunks']:.0f} chunk(s)), six hooks + local pod source; median of "
        f"{runs} run(s), {args.loop} loop; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        table(
            [
                [
                    "RunPodSandbox right after the sync: round trip (runtime process)",
                    f"{med['run_rtt_ms']:.1f} ms",
                    "",
                ],
                [
                    "RunPodSandbox right after the sync: plugin-side",
                    f"{med['run_plugin_ms']:.2f} ms",
                    "≤ 5 ms",
                ],
                [
                    "longest plugin loop step, sync → end: loop-thread CPU (stdlib loop: every callback)",
                    f"{med['longest_cpu_ms']:.1f} ms",
                    "≤ 5 ms",
                ],
                [
                    "the same without the garbage collections that ran inside the step",
                    f"{med['longest_own_ms']:.1f} ms",
                    "",
                ],
                [
                    "longest plugin loop step, sync → end: wall (adds time preempted by other processes)",
                    f"{med['longest_step_ms']:.1f} ms",
                    "",
                ],
                ["worst 1 ms probe lateness, sync → end", f"{med['probe_late_ms']:.1f} ms", ""],
                ["longest garbage collection, sync → end", f"{med['gc_ms']:.1f} ms", ""],
                ["Synchronize, runtime wall time (all chunks)", f"{med['sync_runtime_ms']:.0f} ms", ""],
                ["Synchronize, plugin time (all chunks)", f"{med['sync_plugin_ms']:.0f} ms", ""],
                ["CreateContainer after it, round trip p50", f"{med['create_rtt_p50_us']:.0f} µs", ""],
            ],
            ["measure", "value", "budget"],
        )
    )
    print(
        "per run (RunPodSandbox rtt / plugin-side / longest step CPU / wall / longest GC, ms): "
        + "; ".join(
            f"{r['run_rtt_ms']:.1f}/{r['run_plugin_ms']:.2f}/{r['longest_cpu_ms']:.1f}/"
            f"{r['longest_step_ms']:.1f}/{r['gc_ms']:.1f}"
            for r in results
        )
    )
    print("longest (CPU) step of the last run: " + results[-1]["what"])
    print("longest step without GC of the last run: " + results[-1]["own_what"])
    if args.slow_steps:
        for i, r in enumerate(results):
            print(f"run {i + 1}: steps over {SLOW_STEP * 1e3:.1f} ms CPU: {len(r['slow_what'])}")
            for used, what in r["slow_what"][: args.slow_steps]:
                print(f"  {used * 1e3:5.1f} ms  {what}")


def main() -> None:
    """Parse flags and run (or play the runtime role)."""
    p = two_process_parser(__doc__.splitlines()[0], ("plugin", "runtime", "sync-runtime"))
    add_busy_poll(p)
    p.add_argument("--pods", type=int, default=200)
    p.add_argument("--per-pod", type=int, default=2)
    p.add_argument("--scenario", choices=["create", "sync", "all"], default="all")
    p.add_argument("--sync-pods", type=int, default=50)
    p.add_argument("--sync-per-pod", type=int, default=50)
    p.add_argument("--slow-steps", type=int, default=0, help="list this many of each run's slowest steps")
    args = p.parse_args()
    if args.role == "runtime":
        run(runtime_role(args.socket, args.calls, args.pods, args.per_pod), args.loop)
        return
    if args.role == "sync-runtime":
        run(sync_runtime_role(args.socket, args.sync_pods, args.sync_per_pod), args.loop)
        return
    quiet_logs()
    if args.scenario in ("sync", "all"):
        sync_main(args)
    if args.scenario == "sync":
        return
    calls = 200 if args.quick else args.calls
    runs = 1 if args.quick else args.runs
    results = [
        run(one_run(calls, args.pods, args.per_pod, args.loop, args.busy_poll), args.loop)
        for _ in range(runs)
    ]
    med = {k: median([r[k] for r in results]) for k in results[0]}
    n_ctr = args.pods * args.per_pod
    load = os.getloadavg()
    print(
        f"NRI benchmark — {machine()}; {calls} CreateContainer calls, median of {runs} run(s), {args.loop} "
        f"loop; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
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
