"""Memory QoS and blkio on this machine's real cgroup v1 hierarchy, inside uniquely named scratch cgroups.

The pod's dirs are `<scratch>/kubepods/burstable/pod<uid>/<container id>`; the strategies' writes never
touch anything else, and the scratch dirs are removed afterwards (also when a test fails).
* memory QoS: whatever memory QoS files this kernel has are detected once at start and written; the ones it
  lacks (mainline v1 has none of memory.min/low/high, wmark, priority) are never attempted: no write error.
* blkio: a real per-device throttle on this machine's root disk lands in the scratch besteffort cgroup
  and is reset (the kernel drops the line) when the class is disabled.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from koordqos.cgroups.executor import CGROUP_WRITES, CgroupExecutor
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion, parse_device_lines
from koordqos.decisions import DecisionLog
from koordqos.metrics.localstorage import read_local_storage
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState
from koordqos.strategies.blkio import BlkioReconcileStrategy
from koordqos.strategies.memoryqos import ABSENT_FILES, MEMORY_QOS_RESOURCES, CgroupReconcileStrategy
from koordqos.testing.scratchcg import REAL_ROOT, Scratch, remove_tree, unavailable_reason
from koordqos.testing.strategyenv import strategy_env

pytestmark = pytest.mark.cgroupv1
GiB = 1 << 30


class ScratchLayout(CgroupLayout):
    """The real v1 hierarchy with the kubepods tree moved under a scratch dir."""

    def __init__(self, prefix: str) -> None:
        super().__init__(REAL_ROOT, CgroupVersion.V1, CgroupDriver.CGROUPFS)
        self.prefix = prefix

    def kubepods_dir(self) -> str:
        return f"{self.prefix}/kubepods"

    def qos_dir(self, kube_qos: KubeQoS) -> str:
        return f"{self.prefix}/{super().qos_dir(kube_qos)}"


def _skip_unless_v1() -> None:
    reason = unavailable_reason()
    if reason:
        print(f"skipping real cgroup v1 test: {reason}")
        pytest.skip(reason)


POD = PodInfo(
    uid="real-memqos",
    namespace="default",
    name="real",
    labels={"koordinator.sh/qosClass": "LS"},
    kube_qos=KubeQoS.BURSTABLE,
    containers=(
        ContainerInfo(
            name="main",
            container_id="containerd://c1",
            requests={"memory": GiB},
            limits={"memory": 2 * GiB},
        ),
    ),
)
NODE = NodeInfo(name="n", capacity={"memory": 8 * GiB}, allocatable={"memory": 8 * GiB})


@pytest.fixture
def scratch() -> Iterator[tuple[Scratch, ScratchLayout]]:
    _skip_unless_v1()
    sc = Scratch()
    layout = ScratchLayout(sc.name)
    try:
        for rel in ("", "kubepods", "kubepods/burstable", "kubepods/besteffort"):
            sc.mkcg(rel)
        pod_rel = layout.pod_dir(POD).removeprefix(f"{sc.name}/")
        sc.mkcg(pod_rel)
        sc.mkcg(f"{pod_rel}/c1")
    except OSError as exc:
        sc.cleanup()
        print(f"skipping real cgroup v1 test: cannot create scratch cgroup: {exc}")
        pytest.skip(f"cannot create scratch cgroup: {exc}")
    try:
        yield sc, layout
    finally:
        sc.cleanup()
        assert not (REAL_ROOT / "memory" / sc.name).exists()


async def test_memory_qos_detects_the_kernels_files_once_and_never_fails(
    scratch: tuple[Scratch, ScratchLayout],
) -> None:
    sc, layout = scratch
    kubepods = REAL_ROOT / "memory" / layout.kubepods_dir()
    expected = frozenset(r for r in MEMORY_QOS_RESOURCES if (kubepods / r).exists())
    decisions = DecisionLog()
    executor = CgroupExecutor(layout, decisions)
    env = strategy_env(layout, decisions, executor=executor)
    slo = parse_nodeslo(
        {
            "spec": {
                "resourceQOSStrategy": {
                    "lsClass": {
                        "memoryQOS": {
                            "enable": True,
                            "minLimitPercent": 50,
                            "throttlingPercent": 80,
                            "wmarkRatio": 95,
                            "priority": 5,
                        }
                    }
                }
            }
        }
    )
    state = NodeState(pods=MappingProxyType({POD.uid: POD}), node=NODE, node_slo=slo)
    limit_before = sc.read(layout.pod_dir(POD), "memory", "memory.limit_in_bytes")
    failed_before = sum(CGROUP_WRITES.labels(r, "failed")._value.get() for r in MEMORY_QOS_RESOURCES)
    strategy = CgroupReconcileStrategy()
    for _ in range(3):
        await strategy.run_once(state, env)
    print(f"memory QoS files on this kernel: {sorted(expected) or 'none'}")
    assert strategy.supported == expected
    for r in MEMORY_QOS_RESOURCES:
        assert ABSENT_FILES.labels("CgroupReconcile", r)._value.get() == (0 if r in expected else 1)
    failed_after = sum(CGROUP_WRITES.labels(r, "failed")._value.get() for r in MEMORY_QOS_RESOURCES)
    assert failed_after == failed_before  # never a write error
    pod_dir = layout.pod_dir(POD)
    if "memory.min" in expected:
        assert int(sc.read(pod_dir, "memory", "memory.min")) == GiB // 2
    if "memory.priority" in expected:
        assert sc.read(pod_dir, "memory", "memory.priority") == "5"
    if not expected:
        assert executor.file_writes == 0
        assert strategy.last_writes == 0
    assert sc.read(pod_dir, "memory", "memory.limit_in_bytes") == limit_before  # not ours to touch


@pytest.fixture
def blkio_scratch() -> Iterator[tuple[ScratchLayout, str]]:
    _skip_unless_v1()
    base = REAL_ROOT / "blkio"
    if not (base / "blkio.throttle.read_iops_device").exists():
        print("skipping real blkio test: no blkio v1 throttle files")
        pytest.skip("no blkio v1 throttle files")
    storage = read_local_storage("/sys", "/proc")
    disk = next(
        (d for d in sorted(storage.disk_number) if not Path(d).name.startswith(("loop", "zram"))), None
    )
    if disk is None:
        print("skipping real blkio test: no block disk under /sys/block")
        pytest.skip("no block disk under /sys/block")
    name = f"koordqos-test-{uuid.uuid4().hex[:12]}"
    try:
        for rel in ("", "kubepods", "kubepods/besteffort"):
            (base / name / rel).mkdir()
    except OSError as exc:
        remove_tree(base / name)
        print(f"skipping real blkio test: cannot create scratch cgroup: {exc}")
        pytest.skip(f"cannot create scratch cgroup: {exc}")
    try:
        yield ScratchLayout(name), disk
    finally:
        remove_tree(base / name)
        assert not (base / name).exists()


async def test_blkio_throttle_on_the_real_root_disk(blkio_scratch: tuple[ScratchLayout, str]) -> None:
    layout, disk = blkio_scratch
    number = read_local_storage("/sys", "/proc").disk_number[disk]
    decisions = DecisionLog()
    executor = CgroupExecutor(layout, decisions)
    env = strategy_env(layout, decisions, executor=executor)
    blocks = [{"name": disk, "type": "device", "ioCfg": {"readIOPS": 1024, "writeBPS": 10485760}}]

    def slo(enable: bool) -> Any:
        qos = {"beClass": {"blkioQOS": {"enable": enable, "blocks": blocks}}}
        return parse_nodeslo({"spec": {"resourceQOSStrategy": qos}})

    be = REAL_ROOT / "blkio" / layout.qos_dir(KubeQoS.BESTEFFORT)
    strategy = BlkioReconcileStrategy()
    await strategy.run_once(NodeState(node_slo=slo(True)), env)
    assert strategy.last_plan is not None
    assert strategy.last_plan.problems == {}
    print(f"blkio throttles on {disk} ({number}) in {be}")
    assert parse_device_lines((be / "blkio.throttle.read_iops_device").read_text()) == {number: "1024"}
    assert parse_device_lines((be / "blkio.throttle.write_bps_device").read_text()) == {number: "10485760"}
    writes = executor.file_writes
    await strategy.run_once(NodeState(node_slo=slo(True)), env)
    assert executor.file_writes == writes  # steady state: cached, nothing written
    # the class disabled: the disk's entries are reset, and the kernel drops them
    await strategy.run_once(NodeState(node_slo=slo(False)), env)
    assert parse_device_lines((be / "blkio.throttle.read_iops_device").read_text()) == {}
    assert parse_device_lines((be / "blkio.throttle.write_bps_device").read_text()) == {}
