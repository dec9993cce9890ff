"""The layout matrix: the whole agent (local mode, pods from the mock NRI runtime) on every node shape
it meets — cgroup v1 as systemd mounts it (`cpu -> cpu,cpuacct`), v1 with separate mounts, hybrid (v1 +
`unified`), v2 — under both kubelet drivers (cgroupfs, systemd). In each: the seed BE pod's batch values at
pod and container level, CPU suppress's BE quota, CPU burst, memory QoS, the collector's pod CPU, the
NodeMetric's pod usage and the reconciler correcting an external change; nothing refused or failed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from koordqos.agent import Agent
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.metrics.types import MetricKind
from koordqos.model.quantity import to_milli
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.report.nodemetric import StatusSkipped
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.nodefs import SyntheticNode, V1Mounts
from koordqos.testing.poll import wait_until

GiB = 1 << 30
SHAPES = {
    "v1-systemd": {},
    "v1-separate": {"v1_mounts": V1Mounts.SEPARATE},
    "hybrid": {"hybrid": True},
    "v2": {"version": CgroupVersion.V2},
}
MATRIX = [(shape, driver) for shape in SHAPES for driver in CgroupDriver]
IDS = [f"{shape}-{driver}" for shape, driver in MATRIX]
BE_UID = "3b1f0c2e-7d4a-4c55-9e61-0a1b2c3d4e5f"
LS_UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
BE_CPU_RATE = 0.5  # cores the BE pod's counters advance by
NODESLO = {
    "resourceUsedThresholdWithBE": {
        "enable": True,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cfsQuota",
    },
    "cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 200},
    "resourceQOSStrategy": {
        "lsClass": {
            "cpuQOS": {"enable": True},
            "memoryQOS": {"enable": True, "throttlingPercent": 80},
        },
        "beClass": {"cpuQOS": {"enable": True}},
    },
}
EXTENSIONS = ("cpu.bvt_warp_ns", "cpu.cfs_burst_us", "memory.min", "memory.low", "memory.high")


def sandbox(
    name: str, uid: str, qos: str, kube_qos: str, driver: CgroupDriver, **annotations: str
) -> api.PodSandbox:
    pod = api.PodSandbox(
        id=f"sbx-{name}".ljust(16, "0"),
        name=name,
        uid=uid,
        namespace="default",
        labels={"koordinator.sh/qosClass": qos, "io.kubernetes.pod.uid": uid},
        annotations=annotations,
    )
    if driver is CgroupDriver.SYSTEMD:
        pod.linux.cgroup_parent = f"kubepods-{kube_qos}-pod{uid.replace('-', '_')}.slice"
    else:
        pod.linux.cgroup_parent = f"/kubepods/{kube_qos}/pod{uid}"
    return pod


def container(
    pod: api.PodSandbox, cid: str, name: str, driver: CgroupDriver, cpu_m: int, mem: int
) -> api.Container:
    ctr = api.Container(id=cid, pod_sandbox_id=pod.id, name=name, state=api.CONTAINER_CREATED)
    res = ctr.linux.resources
    res.cpu.shares.value = max(2, cpu_m * 1024 // 1000)
    res.cpu.quota.value = cpu_m * 100 if cpu_m else -1
    res.cpu.period.value = 100000
    res.memory.limit.value = mem
    parent = pod.linux.cgroup_parent
    ctr.linux.cgroups_path = (
        f"{parent}:cri-containerd:{cid}" if driver is CgroupDriver.SYSTEMD else f"{parent}/{cid}"
    )
    return ctr


BATCH_SPEC = json.dumps(
    {
        "containers": {
            "worker": {
                "requests": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"},
                "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "2Gi"},
            }
        }
    }
)


@dataclass
class Node:
    """One shape's node with the agent running on it."""

    node: SyntheticNode
    agent: Agent
    runtime: MockRuntime
    be_pod: str
    be_ctr: str
    ls_pod: str
    ls_ctr: str

    def read(self, rel: str, v1: tuple[str, str], v2: tuple[str, str]) -> str:
        sub, name = v1 if self.node.version is CgroupVersion.V1 else v2
        return self.node.read(rel, sub, name)


async def advance_be(node: SyntheticNode, rel: str, stop: asyncio.Event) -> None:
    """The BE pod's CPU counter (and the node's) at BE_CPU_RATE cores, in proportion to elapsed time."""
    t0 = time.monotonic()
    done = busy_done = idle_done = 0
    while not stop.is_set():
        elapsed = time.monotonic() - t0
        target = int(BE_CPU_RATE * 1e9 * elapsed)
        node.add_cpu_usage(rel, target - done)
        done = target
        busy, total = int(BE_CPU_RATE * 100 * elapsed), int(4 * 100 * elapsed)
        node.advance_node_cpu(busy - busy_done, (total - busy) - idle_done)
        busy_done, idle_done = busy, total - busy
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


@contextlib.asynccontextmanager
async def running(
    shape: str,
    driver: CgroupDriver,
    short_dir: Path,
    nodeslo: dict[str, Any] | None = None,
    gates: dict[str, bool] | None = None,
    prepare: Callable[[SyntheticNode], None] | None = None,
) -> AsyncIterator[Node]:
    """The agent on a `shape` node with the LS and BE pods running; `nodeslo` (NODESLO by default) in the
    local NodeSLO file (short_dir/nodeslo.json, which the test may rewrite), `gates` over the defaults,
    `prepare` run on the node before the agent starts."""
    kw = dict(SHAPES[shape])
    version = kw.pop("version", CgroupVersion.V1)
    node = SyntheticNode(short_dir / "node", version, driver, cpus=4, extensions=EXTENSIONS, **kw)  # type: ignore[arg-type]
    assert node.describe() == shape
    lay = node.layout
    be = sandbox(
        "batch-job",
        BE_UID,
        "BE",
        "besteffort",
        driver,
        **{"node.koordinator.sh/extended-resource-spec": BATCH_SPEC},
    )
    ls = sandbox("web", LS_UID, "LS", "burstable", driver)
    be_ctr = container(be, "be" + "0" * 14, "worker", driver, 0, 0)
    ls_ctr = container(ls, "ls" + "0" * 14, "nginx", driver, 1000, 1 * GiB)
    dirs = {}
    for obj, path in (
        (be, be.linux.cgroup_parent),
        (ls, ls.linux.cgroup_parent),
        (be_ctr, be_ctr.linux.cgroups_path),
        (ls_ctr, ls_ctr.linux.cgroups_path),
    ):
        rel = lay.normalize_parent(path)
        node.make_cgroup(rel)
        dirs[id(obj)] = rel
    for rel in (dirs[id(be)], dirs[id(be_ctr)]):  # what the kubelet and runc set for a BestEffort pod
        if version is CgroupVersion.V1:
            node.write(rel, "cpu", "cpu.shares", 2)
        else:
            node.write(rel, "cpu", "cpu.weight", 1)
    if prepare is not None:
        prepare(node)
    slo = short_dir / "nodeslo.json"
    slo.write_text(json.dumps(NODESLO if nodeslo is None else nodeslo))
    sock = short_dir / "nri.sock"
    runtime = MockRuntime(sock, runtime_name="containerd")
    await runtime.start()
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "nri": {"socket": str(sock), "backoff_seconds": 0.05, "backoff_cap_seconds": 0.2},
            "kube": {"node_name": "matrix-node", "nodeslo_file": str(slo)},
            "hooks": {"reconcile_interval_seconds": 0.5},
            "executor": {"resource_force_update_seconds": 1.0},
            "feature_gates": {"RdtResctrl": False, "CgroupReconcile": True, **(gates or {})},
            "report": {"kubelet_cpu_manager_policy": "none"},
        }
    )
    agent = Agent(cfg, packages=("metrics", "kube", "nri", "strategies", "hooks", "report"), local_mode=True)
    run = asyncio.create_task(agent.run())
    stop = asyncio.Event()
    advancing = asyncio.create_task(advance_be(node, dirs[id(be)], stop))
    try:
        await runtime.wait_joined(timeout=10)
        for pod, ctr in ((ls, ls_ctr), (be, be_ctr)):
            await runtime.run_pod_sandbox(pod)
            await runtime.create_container(pod, ctr)
            ctr.state = api.CONTAINER_RUNNING
            await runtime.start_container(pod, ctr)
        yield Node(node, agent, runtime, dirs[id(be)], dirs[id(be_ctr)], dirs[id(ls)], dirs[id(ls_ctr)])
    finally:
        stop.set()
        await advancing
        agent.stop()
        await asyncio.wait_for(run, 10)
        await runtime.stop()


@pytest.mark.parametrize(("shape", "driver"), MATRIX, ids=IDS)
async def test_every_node_shape(shape: str, driver: CgroupDriver, short_dir: Path) -> None:
    async with running(shape, driver, short_dir) as n:
        v1 = n.node.version is CgroupVersion.V1
        where = f"{shape}/{driver}"

        # the seed BE scenario: batch-cpu request 1000 m → shares 1024 (v2 weight 39), batch-memory limit
        # 2 GiB → memory limit, at pod and container level (the reconciler writes both)
        def batch_values(rel: str) -> tuple[str, str]:
            shares = n.read(rel, ("cpu", "cpu.shares"), ("cpu", "cpu.weight"))
            return shares, n.read(rel, ("memory", "memory.limit_in_bytes"), ("memory", "memory.max"))

        want = ("1024" if v1 else "39", str(2 * GiB))
        for rel in (n.be_pod, n.be_ctr):
            await wait_until(
                lambda rel=rel: batch_values(rel) == want,
                timeout=15,
                message=f"{where}: batch values in {rel} ({batch_values(rel)})",
            )
        # CPU suppress (cfsQuota, 65 % of 4 CPUs = 2.6, BE using 0.5, nothing else busy): the BE tier's quota
        be_qos = n.node.layout.qos_dirs()[2]

        def quota() -> int:
            q = n.read(be_qos, ("cpu", "cpu.cfs_quota_us"), ("cpu", "cpu.max")).split()[0]
            return -1 if q == "max" else int(q)

        # (the simulated counters advance with wall time: on a loaded machine a round can see a late sample
        # as system usage and cut deeper for a round; the quota settles in the range)
        def suppress_state() -> str:
            """What CPU suppress last planned and read (for the failure message)."""
            manager = n.agent.parts.qos_manager
            runner = manager.runners.get("BECPUSuppress") if manager is not None else None
            plan = getattr(runner.strategy, "last_plan", None) if runner is not None else None
            store = n.agent.services.metric_store
            runs = runner.runs if runner is not None else None
            node_cpu = store.last(MetricKind.NODE_CPU_USAGE)
            pod_cpu = store.last(MetricKind.POD_CPU_USAGE, BE_UID)
            return f"quota {quota()}, runs {runs}, plan {plan}, node cpu {node_cpu}, BE pod cpu {pod_cpu}"

        await wait_until(
            lambda: 200_000 <= quota() <= 260_000,
            timeout=15,
            message=lambda: f"{where}: BE quota suppressed to 200000-260000 ({suppress_state()})",
        )
        # CPU burst (cpuBurstOnly, 200 %): the LS container's CFS burst, 1 CPU limit → 2 CPUs of burst
        await wait_until(
            lambda: n.read(n.ls_ctr, ("cpu", "cpu.cfs_burst_us"), ("cpu", "cpu.max.burst")) == "200000",
            timeout=15,
            message=f"{where}: the LS container's CFS burst",
        )
        # memory QoS (LS class, throttlingPercent 80): memory.high at 80 % of the LS container's 1 GiB
        # limit, page aligned (its request is 0: a local-mode pod's requests are not known to the runtime)
        high = str((GiB * 80 // 100) // 4096 * 4096)
        await wait_until(
            lambda: n.node.read(n.ls_ctr, "memory", "memory.high") == high,
            timeout=15,
            message=f"{where}: the LS container's memory.high",
        )
        # the collector's pod CPU: from cpuacct (v1: through systemd's link when co-mounted) or cpu.stat
        store = n.agent.services.metric_store
        await wait_until(
            lambda: abs((store.last(MetricKind.POD_CPU_USAGE, BE_UID) or 0) - BE_CPU_RATE) < 0.1,
            timeout=15,
            message=f"{where}: the BE pod's CPU ({store.last(MetricKind.POD_CPU_USAGE, BE_UID)})",
        )
        # the NodeMetric the node would report has the pod's usage
        reporters = n.agent.parts.reporters
        assert reporters is not None

        def pod_cpu() -> float | None:
            status = reporters.nodemetric.build()
            if isinstance(status, StatusSkipped):
                return None
            pods = {p["name"]: p for p in status.get("podsMetric", [])}
            usage = pods.get("batch-job", {}).get("podUsage", {}).get("resources", {})
            return to_milli(usage["cpu"]) / 1000 if "cpu" in usage else None

        await wait_until(
            lambda: abs((pod_cpu() or 0) - BE_CPU_RATE) < 0.1,
            timeout=15,
            message=f"{where}: the NodeMetric's BE pod CPU ({pod_cpu()})",
        )
        # the reconciler puts back what someone else changed
        if v1:
            n.node.write(n.be_pod, "cpu", "cpu.shares", 2)
        else:
            n.node.write(n.be_pod, "cpu", "cpu.weight", 1)
        await wait_until(
            lambda: batch_values(n.be_pod) == want,
            timeout=15,
            message=f"{where}: the reconciler restoring the BE pod's shares",
        )
        # nothing refused or failed anywhere: on the systemd layout that was every cpu-controller write
        problems = [
            d
            for d in n.agent.decisions.recent()
            if d.action.startswith("write-") and d.action != "write-loosen"
        ]
        assert problems == [], problems
