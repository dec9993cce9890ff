"""Proxy mode: RuntimeHookService PreCreateContainerHook round trip p50/p99 (grpclib over a unix socket),
server-side time, and PreRunPodSandboxHook (which also writes the pod cgroup) round trip.

The agent side (this process) runs the RuntimeHookService with the runtime hooks of koordqos
(BatchResource, CPUNormalization, CPUSetAllocator, CoreSched, GroupIdentity, OOMScoreAdj) over a synthetic
cgroup tree. The client (a child process: this script with `--role client`) plays koord-runtime-proxy: a
grpclib channel on the socket, sequential calls for a BE pod with batch resources, every reply checked.
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpclib.client import Channel

from _common import (
    ALL_HOOK_GATES,
    BATCH_EXTENDED_RESOURCE_SPEC,
    machine,
    median,
    percentile,
    quiet_logs,
    table,
    two_process_parser,
)
from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.decisions import DecisionLog
from koordqos.features import DEFAULT_GATES
from koordqos.hooks import probe_bvt_system
from koordqos.hooks.core import HookCore
from koordqos.hooks.runtime import HookOptions, RuntimeHooks
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.proxy.api.runtime_api_grpc import RuntimeHookServiceStub
from koordqos.proxy.convert import ProxyConverter
from koordqos.proxy.server import ProxyServer
from koordqos.proxy.service import RuntimeHookService, core_handler
from koordqos.testing.nodefs import SyntheticNode

UID = "bench-0001"
POD_META = rpb.PodSandboxMetadata(name="bench", uid=UID, namespace="default")
LABELS = {"koordinator.sh/qosClass": "BE"}
ANNOTATIONS = {
    "node.koordinator.sh/extended-resource-spec": BATCH_EXTENDED_RESOURCE_SPEC,
    "koordinator.sh/oom-score-adj": "500",
}
PARENT = f"/kubepods/besteffort/pod{UID}"


async def client_role(sock: str, calls: int) -> None:
    """koord-runtime-proxy's side: `calls` PreCreateContainerHook and calls/4 PreRunPodSandboxHook."""
    channel = Channel(path=sock)
    stub = RuntimeHookServiceStub(channel)
    reqs = [
        rpb.ContainerResourceHookRequest(
            pod_meta=POD_META,
            container_meta=rpb.ContainerMetadata(name=f"c{j}"),
            pod_labels=LABELS,
            pod_annotations=ANNOTATIONS,
            pod_cgroup_parent=PARENT,
            container_resources=rpb.LinuxContainerResources(cpu_shares=2, cpu_quota=-1, cpuset_cpus="0-3"),
            container_envs={"PATH": "/usr/bin"},
        )
        for j in range(16)
    ]
    sandbox = rpb.PodSandboxHookRequest(
        pod_meta=POD_META, labels=LABELS, annotations=ANNOTATIONS, cgroup_parent=PARENT
    )
    create: list[float] = []
    run: list[float] = []
    try:
        for i in range(calls):
            t0 = time.perf_counter()
            resp = await stub.PreCreateContainerHook(reqs[i % len(reqs)])
            create.append(time.perf_counter() - t0)
            assert resp is not None
            res = resp.container_resources
            assert (res.cpu_quota, res.cpu_shares, res.memory_limit_in_bytes) == (200000, 1024, 4 << 30), res
        for _ in range(max(1, calls // 4)):
            t0 = time.perf_counter()
            pod = await stub.PreRunPodSandboxHook(sandbox)
            run.append(time.perf_counter() - t0)
            assert pod is not None
            assert pod.resources.cpu_quota == 16 * 200000, pod
    finally:
        channel.close()
    print(json.dumps({"create": create, "run": run}), flush=True)


async def one_run(calls: int) -> dict[str, float]:
    """One server + client-process run; returns the figures of this run."""
    tmp = Path(tempfile.mkdtemp(prefix="kqpbench-", dir="/tmp"))
    node = SyntheticNode(tmp / "node", extensions=("cpu.bvt_warp_ns", "cpu.idle"))
    node.make_cgroup(node.layout.normalize_parent(PARENT))
    bus = EventBus()
    hooks = RuntimeHooks(
        HookOptions(
            gates=dict(DEFAULT_GATES) | dict.fromkeys(ALL_HOOK_GATES, True),
            bvt=probe_bvt_system(node.layout, node.proc_root),
            core_sched_reason="bench",
        )
    )
    assert sorted(hooks.names) == sorted(ALL_HOOK_GATES), hooks.names
    decisions = DecisionLog()
    core = HookCore(hooks, CgroupExecutor(node.layout, decisions), decisions)
    service = RuntimeHookService(bus, ProxyConverter(node.layout), handler=core_handler(core))
    service.timings = {}
    server = ProxyServer(service, tmp / "koordlet.sock")
    try:
        await server.start()
        before = resource.getrusage(resource.RUSAGE_SELF)
        cmd = [sys.executable, __file__, "--role", "client", "--socket", str(server.socket_path)]
        proc = await asyncio.create_subprocess_exec(*cmd, "--calls", str(calls), stdout=subprocess.PIPE)
        stdout, _ = await proc.communicate()
        if proc.returncode != 0 or not stdout:
            raise SystemExit("the client process failed")
        after = resource.getrusage(resource.RUSAGE_SELF)
        out = json.loads(stdout)
    finally:
        await server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    server_side = service.timings["PreCreateContainerHook"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    served = len(out["create"]) + len(out["run"])
    return {
        "rtt_p50": percentile(out["create"], 50) * 1e6,
        "rtt_p99": percentile(out["create"], 99) * 1e6,
        "server_p50": percentile(server_side, 50) * 1e6,
        "server_p99": percentile(server_side, 99) * 1e6,
        "cpu_per_call": cpu / served * 1e6,
        "run_p50": percentile(out["run"], 50) * 1e6,
        "run_p99": percentile(out["run"], 99) * 1e6,
    }


def main() -> None:
    """Parse flags and run (or play the client role)."""
    p = two_process_parser((__doc__ or "").splitlines()[0], ("server", "client"))
    args = p.parse_args()
    if args.role == "client":
        asyncio.run(client_role(args.socket, args.calls))
        return
    quiet_logs()
    calls = 200 if args.quick else args.calls
    runs = 1 if args.quick else args.runs
    results = [asyncio.run(one_run(calls)) for _ in range(runs)]
    med = {k: median([r[k] for r in results]) for k in results[0]}
    print(
        f"Proxy-mode benchmark — {machine()}; {calls} PreCreateContainerHook calls, median of {runs} run(s)"
    )
    print(
        table(
            [
                [
                    "PreCreateContainerHook round trip p50 / p99 (client process)",
                    f"{med['rtt_p50']:.0f} / {med['rtt_p99']:.0f} µs",
                ],
                [
                    "PreCreateContainerHook handler p50 / p99 (decode → hooks → reply queued)",
                    f"{med['server_p50']:.0f} / {med['server_p99']:.0f} µs",
                ],
                [
                    "agent CPU per call (HTTP/2 + gRPC framing, hooks, all calls)",
                    f"{med['cpu_per_call']:.0f} µs",
                ],
                [
                    "PreRunPodSandboxHook round trip p50 / p99 (with pod cgroup writes)",
                    f"{med['run_p50']:.0f} / {med['run_p99']:.0f} µs",
                ],
            ],
            ["measure", "value"],
        )
    )


if __name__ == "__main__":
    main()
