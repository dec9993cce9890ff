"""PSI: pressure files parsed, stall fractions from totals, koordlet's metric names and labels, the node's
PSI on this real kernel under a real burner."""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.events.types import PodDeleted, PodUpserted
from koordqos.metrics.psi import POD_PSI, PressureLine, PSICollector, StallRates, parse_pressure
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.testing.nodefs import SyntheticNode

LS_POD = PodInfo(
    uid="ls-uid-1",
    namespace="web",
    name="frontend",
    kube_qos=KubeQoS.BURSTABLE,
    labels={"koordinator.sh/qosClass": "LS"},
    containers=(ContainerInfo(name="nginx", container_id="containerd://aaa111"),),
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_parse_the_kernels_lines() -> None:
    cpu = parse_pressure(b"some avg10=1.50 avg60=0.75 avg300=0.10 total=123456\n")
    assert cpu is not None
    assert cpu.some == PressureLine(1.5, 0.75, 0.1, 123456)
    assert cpu.full is None
    mem = parse_pressure(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=2.00 avg60=1.00 avg300=0.50 total=99\n"
    )
    assert mem is not None
    assert mem.full == PressureLine(2.0, 1.0, 0.5, 99)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "full avg10=0 avg60=0 avg300=0 total=1",  # no some line
        "some avg10=nan avg60=0 avg300=0 total=1",
        "some avg10=0 avg60=0 avg300=0 total=-5",
        "some avg10=101 avg60=0 avg300=0 total=5",
        "some avg10=0 avg60=0 total=5",
    ],
)
def test_malformed_files_give_no_sample(text: str) -> None:
    assert parse_pressure(text) is None


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_give_none(data: bytes) -> None:
    p = parse_pressure(data)
    if p is not None:
        assert p.some.total_us >= 0
        assert all(0 <= v <= 100 and not math.isnan(v) for v in (p.some.avg10, p.some.avg60, p.some.avg300))


def test_stall_fraction_from_totals() -> None:
    rates = StallRates()
    assert rates.ratio("k", 1_000_000, 10.0) is None  # first sample
    assert rates.ratio("k", 1_250_000, 11.0) == pytest.approx(0.25)
    assert rates.ratio("k", 5_000_000, 12.0) == 1.0  # clamped: more than the interval (a late read)
    assert rates.ratio("k", 10, 13.0) is None  # counter reset
    rates.end_round()
    rates.end_round()  # unseen for a round: forgotten
    assert rates.ratio("k", 20, 14.0) is None


async def _collector(node: SyntheticNode, clock: Clock, *pods: PodInfo) -> tuple[PSICollector, EventBus]:
    bus = EventBus()
    for pod in pods:
        node.add_pod(pod)
        await bus.publish(PodUpserted(pod))
    psi = PSICollector(
        bus, node.layout, CgroupReader(node.layout), node_name="n1", proc_root=node.proc_root, clock=clock
    )
    return psi, bus


def _gauge(*labels: str) -> float | None:
    return obs.REGISTRY.get_sample_value(
        "koordlet_pod_psi",
        dict(
            zip(
                (
                    "node",
                    "pod_name",
                    "pod_namespace",
                    "pod_uid",
                    "psi_resource_type",
                    "psi_precision",
                    "psi_degree",
                ),
                labels,
                strict=True,
            )
        ),
    )


@pytest.mark.parametrize("driver", list(CgroupDriver))
async def test_v2_pods_and_containers_and_the_node(tmp_path: Path, driver: CgroupDriver) -> None:
    node = SyntheticNode(tmp_path, CgroupVersion.V2, driver)
    clock = Clock()
    psi, bus = await _collector(node, clock, LS_POD)
    pod_dir = node.layout.pod_dir(LS_POD)
    ctr_dir = node.layout.container_dir(LS_POD, "containerd://aaa111")
    node.set_pressure(None, "cpu", 0, 0)
    node.set_pressure(None, "memory", 0, 0)
    node.set_pressure(pod_dir, "cpu", 1_000, 0, avg10=3.5)
    node.set_pressure(pod_dir, "memory", 0, 0)
    node.set_pressure(ctr_dir, "cpu", 500, 0)
    first = await psi.round()
    assert first.pods[LS_POD.uid]["cpu"].some_ratio is None  # no delta yet
    assert "io" not in first.pods[LS_POD.uid]  # no io.pressure: no sample, no error
    assert "io" not in first.node
    clock.now += 2.0
    node.set_pressure(None, "cpu", 400_000, 0)  # 0.4 s of 2 s
    node.set_pressure(pod_dir, "cpu", 1_000 + 1_000_000, 200_000, avg10=3.5)
    node.set_pressure(ctr_dir, "cpu", 500 + 300_000, 0)
    snap = await psi.round()
    assert snap.node["cpu"].some_ratio == pytest.approx(0.2)
    pod_cpu = snap.pods[LS_POD.uid]["cpu"]
    assert pod_cpu.some_ratio == pytest.approx(0.5)
    assert pod_cpu.full_ratio == pytest.approx(0.1)
    assert snap.containers["containerd://aaa111"]["cpu"].some_ratio == pytest.approx(0.15)
    # koordlet's metric, koordlet's labels: the kernel's avg10 of the pod's cpu "some" line
    assert _gauge("n1", "frontend", "web", LS_POD.uid, "cpu", "avg10", "some") == 3.5
    assert _gauge("n1", "frontend", "web", LS_POD.uid, "mem", "avg300", "full") == 0.0
    # the pod goes: its series go with it
    await bus.publish(PodDeleted(LS_POD.uid))
    await psi.round()
    assert _gauge("n1", "frontend", "web", LS_POD.uid, "cpu", "avg10", "some") is None
    assert not any(s.labels.get("pod_uid") == LS_POD.uid for m in POD_PSI.collect() for s in m.samples)


async def test_v1_reads_the_node_only(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    clock = Clock()
    psi, _bus = await _collector(node, clock, LS_POD)
    node.set_pressure(None, "io", 0, 0)
    await psi.round()
    clock.now += 1.0
    node.set_pressure(None, "io", 100_000, 50_000)
    snap = await psi.round()
    assert snap.pods == {}
    assert snap.node["io"].some_ratio == pytest.approx(0.1)
    assert snap.node["io"].full_ratio == pytest.approx(0.05)


@pytest.mark.parametrize("hybrid_pods", [True, False])
async def test_hybrid_reads_pods_from_unified(tmp_path: Path, hybrid_pods: bool) -> None:
    """cgroup v1 + unified (hybrid): the pod's pressure files are in unified/<pod dir> (runc and systemd
    mirror the pod cgroups there); `hybrid_pods=False` is koordlet's v2-only reading."""
    node = SyntheticNode(tmp_path, hybrid=True)
    clock = Clock()
    bus = EventBus()
    node.add_pod(LS_POD)
    await bus.publish(PodUpserted(LS_POD))
    psi = PSICollector(
        bus,
        node.layout,
        CgroupReader(node.layout),
        node_name=f"hybrid-{hybrid_pods}",  # series of its own: the gauges are process-wide
        proc_root=node.proc_root,
        clock=clock,
        hybrid_pods=hybrid_pods,
    )
    pod_dir = node.layout.pod_dir(LS_POD)
    ctr_dir = node.layout.container_dir(LS_POD, "containerd://aaa111")
    node.set_pressure(pod_dir, "cpu", 0, 0)
    node.set_pressure(ctr_dir, "cpu", 0, 0)
    assert (node.cgroup_root / "unified" / pod_dir / "cpu.pressure").is_file()
    await psi.round()
    clock.now += 1.0
    node.set_pressure(pod_dir, "cpu", 300_000, 0, avg10=30.0)
    node.set_pressure(ctr_dir, "cpu", 100_000, 0)
    snap = await psi.round()
    if not hybrid_pods:
        assert snap.pods == {}
        assert _gauge("hybrid-False", "frontend", "web", LS_POD.uid, "cpu", "avg10", "some") is None
        return
    assert snap.pods[LS_POD.uid]["cpu"].some_ratio == pytest.approx(0.3)
    assert snap.containers["containerd://aaa111"]["cpu"].some_ratio == pytest.approx(0.1)
    assert _gauge("hybrid-True", "frontend", "web", LS_POD.uid, "cpu", "avg10", "some") == 30.0


UNIFIED = Path("/sys/fs/cgroup/unified")


def _unified_writable() -> str:
    if not (UNIFIED / "cgroup.controllers").is_file():
        return "this host has no hybrid unified hierarchy at /sys/fs/cgroup/unified"
    if os.geteuid() != 0:
        return "creating a scratch cgroup in the unified hierarchy needs root"
    return ""


@pytest.mark.skipif(bool(_unified_writable()), reason=_unified_writable() or "runs")
async def test_pod_cpu_pressure_on_this_kernels_unified_hierarchy_under_a_real_burner() -> None:
    """The real kernel's pod PSI on a hybrid node: a uniquely named scratch cgroup in this host's unified
    hierarchy stands for the cgroup root (its `unified/kubepods/...` is the pod's mirror), three burners
    pinned to one CPU run in the pod's dir, and the collector reads the kernel's cpu.pressure there: the
    pod's CPU "some" stall is well above zero. The scratch tree is removed afterwards, also on failure."""
    import secrets

    from koordqos.cgroups.layout import CgroupLayout

    scratch = UNIFIED / f"koordqos-psi-{secrets.token_hex(5)}"
    layout = CgroupLayout(scratch, CgroupVersion.V1, CgroupDriver.CGROUPFS, hybrid=True)
    pod_dir = layout.pod_dir(LS_POD)
    real_pod = scratch / "unified" / pod_dir
    made: list[Path] = []
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        d = scratch
        for part in ("", "unified", *pod_dir.split("/")):
            d = d / part if part else d
            d.mkdir()
            made.append(d)
        bus = EventBus()
        await bus.publish(PodUpserted(LS_POD))
        psi = PSICollector(bus, layout, CgroupReader(layout), node_name="real", proc_root="/proc")
        await psi.round()
        ctx = multiprocessing.get_context("fork")
        cpu = min(os.sched_getaffinity(0))
        go = ctx.Event()
        procs = [ctx.Process(target=_pinned_burn_after, args=(cpu, 1.5, go)) for _ in range(3)]
        for p in procs:
            p.start()
            (real_pod / "cgroup.procs").write_text(f"{p.pid}\n")
        go.set()
        for p in procs:
            p.join()
        snap = await psi.round()
        ratio = snap.pods[LS_POD.uid]["cpu"].some_ratio
        assert ratio is not None
        assert ratio > 0.2, ratio
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        for d in reversed(made):
            d.rmdir()


def _pinned_burn_after(cpu: int, seconds: float, go: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    go.wait()
    _burn(seconds)


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(
    not os.path.exists("/proc/pressure/cpu"), reason="this kernel has no /proc/pressure (psi=1)"
)
async def test_node_cpu_pressure_on_this_kernel_under_a_real_burner(tmp_path: Path) -> None:
    """Reads only: /proc/pressure/cpu of this machine. Three busy processes on one CPU keep two waiting, so
    the node's CPU "some" stall is well above zero over the round."""
    layout = SyntheticNode(tmp_path).layout  # v1: no pod file is read; the node's files are the real ones
    psi = PSICollector(EventBus(), layout, CgroupReader(layout), node_name="real", proc_root="/proc")
    await psi.round()
    ctx = multiprocessing.get_context("fork")
    cpu = min(os.sched_getaffinity(0))
    procs = [ctx.Process(target=_pinned_burn, args=(cpu, 1.5)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    snap = await psi.round()
    ratio = snap.node["cpu"].some_ratio
    assert ratio is not None
    assert ratio > 0.2, ratio


def _pinned_burn(cpu: int, seconds: float) -> None:
    os.sched_setaffinity(0, {cpu})
    _burn(seconds)


@pytest.mark.parametrize("gate", [True, False])
def test_the_gate_builds_the_component(tmp_path: Path, gate: bool) -> None:
    from koordqos.agent import Agent
    from koordqos.config import build_config

    node = SyntheticNode(tmp_path / "node", CgroupVersion.V2)
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "feature_gates": {"PSICollector": gate},
        }
    )
    agent = Agent(cfg, packages=("metrics",), local_mode=True)
    agent.build()
    assert (agent.parts.psi is not None) is gate
    assert ("psi-collector" in [c.name for c in agent.components]) is gate
