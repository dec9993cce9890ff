"""Guest-side fixtures: one node per session on the VM's real cgroup v2 hierarchy, with the agent running.

The node: kubepods (cgroupfs driver) with a BE pod (`batch-job`, batch-cpu/batch-memory in its extended
resource spec), a Burstable LS pod (`web`, 1 CPU and 1 GiB limits) and a Guaranteed LS pod (`db`, 500 m and
256 MiB), made as the kubelet and runc make them; the mock NRI runtime (a thread) announces them to the agent
(`python -m koordqos run`, local mode, `--cgroup-root /sys/fs/cgroup`), which writes the real v2 files. A
null_blk disk (`/dev/nullb0`) gives blkio QoS a real block device. Only inside the VM (`V2VM=1`, cgroup2 at
/sys/fs/cgroup): anywhere else every test is skipped with the reason.
"""

from __future__ import annotations

import json
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .v2node import (
    Agent,
    GiB,
    MiB,
    Pod,
    ThreadedRuntime,
    burners,
    lay_out,
    make_dir,
    make_pod,
    remove_tree,
    wait,
    write_nodeslo,
)

_WHY_NOT = None


def _why_not() -> str | None:
    global _WHY_NOT
    if _WHY_NOT is None:
        from .v2node import in_v2_vm

        _WHY_NOT = in_v2_vm() or ""
    return _WHY_NOT or None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    why = _why_not()
    if why is None:
        items.sort(key=_needs_node)  # the in-process tests first, while the agent starts (stable)
        return
    skip = pytest.mark.skip(reason=f"cgroup v2 guest test: {why}; run `python -m nox -s e2e-cgroupv2`")
    for item in items:
        item.add_marker(skip)


BE_UID = "3b1f0c2e-7d4a-4c55-9e61-0a1b2c3d4e5f"
LS_UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
G_UID = "5c4d3e2f-1a0b-4c9d-8e7f-6a5b4c3d2e1f"
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
NULL_BLK = "/dev/nullb0"
SUPPRESS_PERCENT = 40  # of the VM's 2 CPUs: a quota well under what 3 burners ask for


def nodeslo(*, suppress: bool, be_idle: bool, blkio: bool, cost_qos: bool) -> dict[str, Any]:
    """The NodeSLO spec of the scenario: `suppress` switches CPU suppress (cfsQuota) on, `be_idle` the BE
    class's cpuQOS (group identity -1: on this kernel, without Anolis' bvt, BE pods `cpu.idle=1`), `blkio`
    the BE class's blkio QoS on the null_blk disk, `cost_qos` the disk's io cost QoS (cgroupRoot)."""
    be: dict[str, Any] = {"cpuQOS": {"enable": be_idle}}
    root: dict[str, Any] = {}
    if blkio:
        root["blkioQOS"] = {
            "enable": cost_qos,
            "blocks": [{"name": NULL_BLK, "type": "device", "ioCfg": {"readLatency": 2000}}],
        }
    if blkio:
        be["blkioQOS"] = {
            "enable": True,
            "blocks": [
                {
                    "name": NULL_BLK,
                    "type": "device",
                    "ioCfg": {"readIOPS": 2000, "writeBPS": 8 * MiB, "ioWeightPercent": 60},
                }
            ],
        }
    return {
        "resourceUsedThresholdWithBE": {
            "enable": suppress,
            "cpuSuppressThresholdPercent": SUPPRESS_PERCENT,
            "cpuSuppressPolicy": "cfsQuota",
        },
        "cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 200},
        "resourceQOSStrategy": {
            "lsClass": {
                "cpuQOS": {"enable": True},
                "memoryQOS": {
                    "enable": True,
                    "minLimitPercent": 50,
                    "lowLimitPercent": 75,
                    "throttlingPercent": 80,
                    "oomKillGroup": 1,
                },
            },
            "beClass": be,
            "cgroupRoot": root,
        },
    }


@dataclass
class Node:
    """The session's node: its pods, the agent, the runtime and the NodeSLO file."""

    agent: Agent
    runtime: ThreadedRuntime
    nodeslo_path: Path
    be: Pod
    ls: Pod
    db: Pod
    blkio: str | None  # why blkio QoS cannot be tried here (None: /dev/nullb0 is there)
    replies: dict[str, Any]

    def set_nodeslo(self, *, suppress: bool = False, be_idle: bool = False, cost_qos: bool = True) -> None:
        spec = nodeslo(suppress=suppress, be_idle=be_idle, blkio=self.blkio is None, cost_qos=cost_qos)
        write_nodeslo(self.nodeslo_path, spec)


def _null_blk() -> str | None:
    """Load null_blk (one 1 GiB memory-less disk, /dev/nullb0); why not, or None when it is there."""
    if Path(NULL_BLK).exists():
        return None
    mods = Path("/lib/modules") / platform.release() / "kernel"
    modules = (("fs/configfs/configfs.ko", []), ("drivers/block/null_blk/null_blk.ko", ["nr_devices=1"]))
    for rel, params in modules:
        ko = mods / rel
        if not ko.is_file():
            continue  # built in, or not there (then nullb0 is missing below)
        proc = subprocess.run(
            ["/run/v2vm/busybox", "insmod", str(ko), *params], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 and "File exists" not in proc.stderr:
            return f"insmod {ko.name}: {proc.stderr.strip()}"
    return None if Path(NULL_BLK).exists() else f"no {NULL_BLK} after loading null_blk"


@dataclass
class Prepared:
    """The node laid out and the agent started, before the runtime announces the pods."""

    agent: Agent
    nodeslo_path: Path
    be: Pod
    ls: Pod
    db: Pod
    blkio: str | None


def prepare() -> Prepared:
    """Lay the node out on the real hierarchy and start the agent on it (the pods are announced later, by
    the runtime: the agent's dirs and probes find the tree made, as on a node whose kubelet runs)."""
    blkio = _null_blk()
    work = Path(tempfile.mkdtemp(prefix="v2node-"))
    slo = work / "nodeslo.json"
    be = make_pod(
        "batch-job",
        BE_UID,
        "BE",
        "besteffort",
        "worker",
        annotations={"node.koordinator.sh/extended-resource-spec": BATCH_SPEC},
    )
    ls = make_pod("web", LS_UID, "LS", "burstable", "nginx", cpu_m=1000, mem=1 * GiB)
    db = make_pod("db", G_UID, "LS", "guaranteed", "postgres", cpu_m=500, mem=256 * MiB)
    for rel in ("kubepods", "kubepods/burstable", "kubepods/besteffort"):
        make_dir(rel)
    for pod in (be, ls, db):
        lay_out(pod)
    # at the start the disk's io cost QoS is off: the BE weight cannot be written (a reported problem)
    write_nodeslo(slo, nodeslo(suppress=False, be_idle=False, blkio=blkio is None, cost_qos=False))
    agent = Agent(
        work,
        work / "nri.sock",
        slo,
        args=[
            "--feature-gates",
            "RdtResctrl=false,CgroupReconcile=true,PSICollector=true,BlkIOReconcile=true",
            "--kubelet-cpu-manager-policy",
            "none",
            "--runtime-hooks-reconcile-interval",
            "2",
            "--resource-force-update-seconds",
            "5",
        ],
    )
    agent.start()
    return Prepared(agent, slo, be, ls, db, blkio)


_PREPARED: list[Prepared] = []


def _needs_node(item: pytest.Item) -> bool:
    return "node" in getattr(item, "fixturenames", ())


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the agent as soon as the tests are known: its start-up (~15 s of imports under TCG) overlaps
    the tests that need no agent, which run first."""
    if _why_not() is None and any(_needs_node(item) for item in session.items):
        _PREPARED.append(prepare())


def pytest_sessionfinish(session: pytest.Session) -> None:
    for prepared in _PREPARED:  # the node fixture did not run (its tests were skipped): stop the agent
        prepared.agent.stop()
    _PREPARED.clear()
    remove_tree("kubepods")


@pytest.fixture(scope="session")
def node() -> Iterator[Node]:
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    p = _PREPARED.pop() if _PREPARED else prepare()
    agent = p.agent
    with ThreadedRuntime(agent.nri_socket) as runtime:
        try:
            wait(lambda: agent.readyz().get("nri_connected") is True, "the agent's NRI connection")
            runtime.call(runtime.rt.wait_joined(timeout=60))
            replies = {pod.name: runtime.start_pod(pod) for pod in (p.db, p.ls, p.be)}
            yield Node(agent, runtime, p.nodeslo_path, p.be, p.ls, p.db, p.blkio, replies)
        finally:
            rc = agent.stop()
            print(f"\nagent exit code {rc}; log tail:\n{agent.log_tail(15)}")
    remove_tree("kubepods")


BURNERS = 3  # on the VM's 2 CPUs: always more demand than CPU, so a quota throttles and tasks stall


@pytest.fixture(scope="session")
def burning(node: Node) -> Iterator[list[int]]:
    """BURNERS busy loops running in the BE pod's container cgroup (until the end of the session)."""
    with burners(node.be.ctr_dir, BURNERS) as pids:
        yield pids
