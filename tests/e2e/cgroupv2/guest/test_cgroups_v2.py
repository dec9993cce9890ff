"""koordqos's cgroup layer against the real v2 files (inside the v2 VM), in process: the systemd driver's
names (the agent tests use cgroupfs), the executor's v2 rendering and leveled batches, the reader's v2
parsing and its kernfs paths (a removed cgroup's open file fails with ENODEV), the capability probes, the
start-up root checks, and the demo's scratch tree on a unified hierarchy."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.parse import CpuStat
from koordqos.cgroups.reader import CgroupReader, mount_fs_type, read_procs
from koordqos.cgroups.resources import CgroupVersion
from koordqos.cgroups.roots import available_controllers, check_host_roots, missing_controllers
from koordqos.decisions import DecisionLog
from koordqos.model.qos import KubeQoS

from .v2node import ROOT, GiB, MiB, make_dir, read, remove_tree, wait, write

UID = "7e6d5c4b-3a29-4817-8695-a4b3c2d1e0f9"
CID = "containerd://" + "c" * 64


@pytest.fixture
def systemd_tree() -> Iterator[tuple[CgroupLayout, str, str]]:
    """kubepods.slice with a BestEffort pod slice and its container scope, as the systemd driver names
    them; the layout detected from the real root."""
    layout = CgroupLayout.detect(ROOT, driver=CgroupDriver.SYSTEMD)
    pod = layout.pod_dir_for(UID, KubeQoS.BESTEFFORT)
    ctr = layout.container_dir_in(pod, CID)
    for rel in ("kubepods.slice", layout.qos_dir(KubeQoS.BESTEFFORT), pod):
        make_dir(rel)
    make_dir(ctr, leaf=True)
    try:
        yield layout, pod, ctr
    finally:
        remove_tree("kubepods.slice")


def test_detection_and_root_checks_on_the_real_root(systemd_tree: tuple[CgroupLayout, str, str]) -> None:
    layout, pod, ctr = systemd_tree
    assert (layout.version, layout.hybrid) == (CgroupVersion.V2, False)
    assert CgroupLayout.detect(ROOT).driver is CgroupDriver.SYSTEMD  # kubepods.slice is there
    assert (
        pod
        == f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
    )
    assert ctr == f"{pod}/cri-containerd-{'c' * 64}.scope"
    check_host_roots(ROOT, Path("/proc"), Path("/sys"))  # a v2 root: no controller links to check
    assert {"cpu", "cpuacct", "cpuset", "memory", "io", "blkio"} <= available_controllers(ROOT)
    assert missing_controllers(ROOT, {"BECPUSuppress": True, "BlkIOReconcile": True}) == {}
    assert layout.controllers.dirs == {}
    assert mount_fs_type(str(ROOT)) == "cgroup2"


def test_capability_probes(systemd_tree: tuple[CgroupLayout, str, str]) -> None:
    """What this (upstream) kernel has: cpu.idle, cpu.max.burst, memory.min/low/high, memory.oom.group;
    not Anolis' bvt, wmark or memcg priority."""
    layout, _, _ = systemd_tree
    layout.refresh_capabilities()
    have = {r: layout.supports(r) for r in ("cpu.idle", "cpu.cfs_burst_us", "memory.min", "memory.low")}
    have |= {r: layout.supports(r) for r in ("memory.high", "memory.oom.group", "cpu.shares")}
    assert all(have.values()), have
    lacks = ("cpu.bvt_warp_ns", "memory.wmark_ratio", "memory.priority", "net_cls.classid")
    assert not any(layout.supports(r) for r in lacks), {r: layout.supports(r) for r in lacks}
    assert layout.group_identity_supported() is False or (ROOT / "kubepods.slice/cpu.bvt_warp_ns").exists()


async def test_executor_renders_v2_values_and_loosens_top_down(
    systemd_tree: tuple[CgroupLayout, str, str],
) -> None:
    layout, pod, ctr = systemd_tree
    ex = CgroupExecutor(layout, DecisionLog())
    be = layout.qos_dir(KubeQoS.BESTEFFORT)
    writes = [
        CgroupWrite(pod, "cpu.shares", 1024, Level.POD),
        CgroupWrite(ctr, "cpu.shares", 512, Level.CONTAINER),
        CgroupWrite(pod, "cpu.cfs_quota_us", 200_000, Level.POD),
        CgroupWrite(ctr, "cpu.cfs_quota_us", 150_000, Level.CONTAINER),
        CgroupWrite(pod, "memory.limit_in_bytes", 2 * GiB, Level.POD),
        CgroupWrite(ctr, "memory.limit_in_bytes", 1 * GiB, Level.CONTAINER),
        CgroupWrite(pod, "memory.min", 64 * MiB, Level.POD),
        CgroupWrite(ctr, "memory.min", 64 * MiB, Level.CONTAINER),
        CgroupWrite(ctr, "memory.high", 900 * MiB, Level.CONTAINER),
        CgroupWrite(pod, "cpuset.cpus", "1", Level.POD),
        CgroupWrite(ctr, "cpuset.cpus", "1", Level.CONTAINER),
        CgroupWrite(ctr, "cpu.cfs_burst_us", 50_000, Level.CONTAINER),
        CgroupWrite(be, "cpu.idle", 0, Level.QOS),
    ]
    results = await ex.apply("v2", writes, reason="test")
    assert all(r.ok for r in results), [(r.write, r.outcome, r.error) for r in results if not r.ok]
    assert (read(pod, "cpu.weight"), read(ctr, "cpu.weight")) == ("39", "20")
    assert (read(pod, "cpu.max"), read(ctr, "cpu.max")) == ("200000 100000", "150000 100000")
    assert (read(pod, "memory.max"), read(ctr, "memory.max")) == (str(2 * GiB), str(1 * GiB))
    assert read(ctr, "memory.min") == str(64 * MiB)
    assert read(ctr, "memory.high") == str(900 * MiB)
    assert read(ctr, "cpuset.cpus") == "1"
    assert read(ctr, "cpuset.cpus.effective") == "1"  # the kernel took it: the parent allows CPU 1
    assert read(ctr, "cpu.max.burst") == "50000"
    # the period goes with the current quota into cpu.max; unlimited is "max"
    [period] = await ex.apply("v2", [CgroupWrite(ctr, "cpu.cfs_period_us", 50_000, Level.CONTAINER)])
    assert period.outcome is Outcome.WRITTEN
    assert read(ctr, "cpu.max") == "150000 50000"
    unlimited = [
        CgroupWrite(ctr, "cpu.cfs_quota_us", -1, Level.CONTAINER),
        CgroupWrite(ctr, "memory.limit_in_bytes", -1, Level.CONTAINER),
        CgroupWrite(ctr, "memory.high", -1, Level.CONTAINER),
    ]
    assert all(r.outcome is Outcome.WRITTEN for r in await ex.apply("v2", unlimited))
    assert (read(ctr, "cpu.max"), read(ctr, "memory.max"), read(ctr, "memory.high")) == (
        "max 50000",
        "max",
        "max",
    )
    # write-if-different reads the kernel's own spelling back as equal
    again = await ex.apply(
        "v2", [*unlimited, CgroupWrite(pod, "cpu.shares", 1024, Level.POD, cacheable=False)]
    )
    assert {r.outcome for r in again} <= {Outcome.UNCHANGED, Outcome.CACHED}, again
    # a container cpuset above the pod's: pass 1 loosens the pod, pass 2 writes both exactly
    widen = [
        CgroupWrite(pod, "cpuset.cpus", "0-1", Level.POD),
        CgroupWrite(ctr, "cpuset.cpus", "0", Level.CONTAINER),
    ]
    assert all(r.ok for r in await ex.apply("v2", widen))
    assert (read(pod, "cpuset.cpus"), read(ctr, "cpuset.cpus")) == ("0-1", "0")


def test_reader_on_v2_files_and_kernfs_removal(systemd_tree: tuple[CgroupLayout, str, str]) -> None:
    layout, pod, ctr = systemd_tree
    reader = CgroupReader(layout)
    assert reader._check_links is False  # kernfs: a removed cgroup's open file says ENODEV
    write(ctr, "cpu.max", "30000 100000")
    # the shell joins the cgroup, then execs the loop: exec's memory (the new mm, its page tables) is
    # charged to the cgroup; v2 does not move charges with a task, and a loop moved in from outside may
    # fault in nothing (memory.current once stayed 0)
    procs = shlex.quote(str(ROOT / ctr / "cgroup.procs"))
    loop = "exec /bin/sh -c 'while :; do :; done'"
    burner = subprocess.Popen(["/bin/sh", "-c", f"echo $$ >{procs} && {loop}"])
    try:
        wait(lambda: read_procs(layout, ctr) == [burner.pid], "the burner in its cgroup")
        files = reader.file_set([(ctr, "cpu", "cpu.stat"), (ctr, "memory", "memory.current")])
        first = files.read()
        assert all(v is not None for v in first), first

        def usage() -> int:
            return reader.cpu_usage_ns(ctr) or 0

        start = usage()
        wait(lambda: usage() > start + 20_000_000, "20 ms of the burner's CPU in cpu.stat usage_usec")
        wait(
            lambda: (reader.cpu_stat(ctr) or CpuStat(0, 0, 0)).nr_throttled > 0,
            "the burner throttled at 30 %",
        )
        stat = reader.cpu_stat(ctr)
        assert stat is not None
        assert stat.throttled_ns > 0
        assert reader.cpu_quota_period(ctr) == (30000, 100000)
        assert (reader.memory_usage(ctr) or 0) > 0, read(ctr, "memory.stat")
        assert reader.memory_working_set(ctr) is not None
        readings = reader.memory_readings(ctr)
        assert readings is not None
        # cpuset.cpus empty (inherit): the reader takes cpuset.cpus.effective
        assert read(pod, "cpuset.cpus") == ""
        assert reader.cpuset(pod) == frozenset({0, 1})
    finally:
        burner.kill()
        burner.wait()
    wait(lambda: read(ctr, "cgroup.procs") == "", "the killed burner out of its cgroup")
    # the container's cgroup removed while its files are held open: None, then followed when made again
    (ROOT / ctr).rmdir()
    assert files.read() == [None, None]
    assert reader.cpu_usage_ns(ctr) is None
    make_dir(ctr, leaf=True)
    again = files.read()
    assert again[0] is not None
    assert b"usage_usec 0" in again[0]
    files.close()
    reader.close()


def test_demo_scratch_tree_on_a_unified_hierarchy() -> None:
    """`python -m koordqos demo`'s pod tree on v2: made with the controllers handed down, kubelet's
    weights, a process moved in and measured, the BE quota set by hand, then everything removed."""
    from koordqos.demo.cgtree import PodTree, detect_version, stale_trees, unavailable_reason

    assert detect_version() is CgroupVersion.V2
    assert unavailable_reason() is None
    tree = PodTree(version=CgroupVersion.V2)
    tree.create(cpus=2, ls_request_milli=500)
    try:
        assert read(tree.be_pod_dir, "cpu.weight") == "1"
        assert read(tree.ls_pod_dir, "cpu.weight") == str(1 + ((512 - 2) * 9999) // 262142)
        burner = subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"])
        try:
            tree.add_process(tree.be_container_dir, burner.pid)
            assert tree.pids() == {burner.pid}
            tree.set_be_quota(20_000)
            assert tree.be_quota() == 20_000
            wait(lambda: tree.cpu_usage_seconds(tree.be_container_dir) > 0.01, "the burner's CPU time")
        finally:
            burner.kill()
            burner.wait()
        assert tree.name not in stale_trees(version=CgroupVersion.V2)  # its owner (this process) lives
    finally:
        tree.cleanup()
    assert not tree.exists()


def test_the_hosts_tmp_is_seen_in_the_guest() -> None:
    """The guest's /tmp is the host's (read-only below the overlay), not a fresh tmpfs: a checkout or a
    virtual environment under the host's /tmp must run here (a clean clone in /tmp once failed every test)."""
    marker = Path(os.environ["V2VM_HOST_TMP_MARKER"])
    assert marker.is_relative_to("/tmp"), marker
    assert marker.read_text() == "written on the host"
