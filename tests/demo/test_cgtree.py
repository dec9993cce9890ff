"""The scratch pod tree's layout and files, on directories shaped like v1 and v2 hierarchies (the kernel's
own behaviour is covered by the real-kernel demo tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from koordqos.cgroups.resources import CgroupVersion
from koordqos.demo.cgtree import (
    BE_UID,
    LS_UID,
    PodTree,
    detect_version,
    owner_alive,
    process_start_ticks,
    scratch_name,
    stale_trees,
    sweep_stale,
)


def v1_root(tmp: Path) -> Path:
    for c in ("cpu", "cpuacct", "cpuset", "memory"):
        (tmp / c).mkdir()
        (tmp / c / "cgroup.procs").write_text("")
    (tmp / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (tmp / "cpuset" / "cpuset.mems").write_text("0\n")
    return tmp


def v2_root(tmp: Path) -> Path:
    (tmp / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp / "cgroup.subtree_control").write_text("cpuset cpu memory\n")
    return tmp


def test_version_detection(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert detect_version(v1_root(tmp_path / "a")) is CgroupVersion.V1
    (tmp_path / "b").mkdir()
    assert detect_version(v2_root(tmp_path / "b")) is CgroupVersion.V2
    (tmp_path / "c").mkdir()
    assert detect_version(tmp_path / "c") is None


def test_v1_tree_has_kubelet_like_shares_in_every_controller(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    tree = PodTree(name="koordqos-demo-test", root=root, version=CgroupVersion.V1)
    tree.create(cpus=2, ls_request_milli=1200, root_shares=262144)
    cpu = root / "cpu" / tree.name
    assert (cpu / "cpu.shares").read_text() == "262144"
    assert (cpu / "kubepods" / "cpu.shares").read_text() == "2048"
    assert (cpu / "kubepods/besteffort/cpu.shares").read_text() == "2"
    assert (cpu / f"kubepods/besteffort/pod{BE_UID}/burner/cpu.shares").read_text() == "2"
    assert (cpu / f"kubepods/burstable/pod{LS_UID}/cpu.shares").read_text() == "1228"
    for c in ("cpuacct", "cpuset", "memory"):
        assert (root / c / tree.name / "system").is_dir()
        assert (root / c / tree.name / "demo").is_dir()
    assert (root / "cpuset" / tree.ls_container_dir / "cpuset.cpus").read_text() == "0-1\n"
    assert tree.procs_files(tree.system_dir) == [
        root / c / tree.system_dir / "cgroup.procs" for c in ("cpu", "cpuacct", "cpuset", "memory")
    ]
    assert tree.mount_sources() == {c: root / c / tree.name for c in ("cpu", "cpuacct", "cpuset", "memory")}
    (root / "cpu" / tree.be_qos_dir / "cpu.cfs_quota_us").write_text("-1\n")
    assert tree.be_quota() == -1
    tree.set_be_quota(2000)
    assert tree.be_quota() == 2000
    (root / "cpuacct" / tree.ls_pod_dir / "cpuacct.usage").write_text("1500000000\n")
    assert tree.cpu_usage_seconds(tree.ls_pod_dir) == pytest.approx(1.5)


def test_hybrid_v1_tree_is_mirrored_in_unified_for_the_pods_pressure_files(tmp_path: Path) -> None:
    """A hybrid node (v1 controllers + systemd's cgroup v2 mount at unified/): the tree is mirrored there,
    processes join both, the agent gets the mirror as its unified/, and the LS pod's PSI file is there."""
    root = v1_root(tmp_path)
    (root / "unified").mkdir()
    (root / "unified" / "cgroup.controllers").write_text("\n")
    tree = PodTree(name="koordqos-demo-test", root=root, version=CgroupVersion.V1)
    assert tree.hybrid
    tree.create(cpus=2, ls_request_milli=1200)
    assert (root / "unified" / tree.ls_container_dir).is_dir()
    assert (root / "unified" / tree.be_container_dir).is_dir()
    assert tree.procs_files(tree.system_dir)[-1] == root / "unified" / tree.system_dir / "cgroup.procs"
    assert tree.mount_sources()["unified"] == root / "unified" / tree.name
    assert tree.pressure_file(tree.ls_pod_dir) == root / "unified" / tree.ls_pod_dir / "cpu.pressure"
    assert stale_trees(root) == []  # its owner (this process) is alive
    dead = root / "unified" / "koordqos-demo-1-1-deadbeef"  # a gone demo's tree in the mirror only
    dead.mkdir()
    assert stale_trees(root) == [dead.name]
    (tmp_path / "plain").mkdir()
    plain = PodTree(name="koordqos-demo-plain", root=v1_root(tmp_path / "plain"))
    assert not plain.hybrid
    assert plain.pressure_file(plain.ls_pod_dir) is None


def test_v2_tree_delegates_controllers_to_inner_dirs_only(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    tree = PodTree(name="koordqos-demo-test", root=root, version=CgroupVersion.V2)
    tree.create(cpus=2, ls_request_milli=1200)
    base = root / tree.name
    for inner in (
        "",
        "kubepods",
        "kubepods/burstable",
        f"kubepods/burstable/pod{LS_UID}",
        "kubepods/besteffort",
    ):
        assert (base / inner / "cgroup.subtree_control").read_text() == "+cpu +cpuset +memory"
    for leaf in (
        "system",
        "demo",
        f"kubepods/burstable/pod{LS_UID}/probe",
        f"kubepods/besteffort/pod{BE_UID}/burner",
    ):
        assert not (base / leaf / "cgroup.subtree_control").exists()  # processes live in leaves only
    # cpu.weight = the kernel's conversion of shares: 1 + (shares − 2) × 9999 / 262142
    assert (base / "kubepods/besteffort/cpu.weight").read_text() == "1"
    assert (base / "kubepods/cpu.weight").read_text() == str(1 + (2048 - 2) * 9999 // 262142)
    assert tree.mount_sources() == {"": base}
    assert tree.procs_files(tree.system_dir) == [base / "system" / "cgroup.procs"]
    (base / "kubepods/besteffort/cpu.max").write_text("max 100000\n")
    assert tree.be_quota() == -1
    tree.set_be_quota(30_000)
    assert (base / "kubepods/besteffort/cpu.max").read_text() == "30000 100000"
    assert tree.be_quota() == 30_000
    (root / tree.be_qos_dir / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    assert tree.cpu_usage_seconds(tree.be_qos_dir) == pytest.approx(2.5)


def _dead_pid() -> tuple[int, int]:
    """A pid that existed (with its start time, read while it ran) and is gone now."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ticks = process_start_ticks(proc.pid)
    assert ticks is not None
    proc.communicate(b"")
    return proc.pid, ticks


def test_tree_names_record_their_owner_and_a_gone_owner_is_recognised() -> None:
    mine = scratch_name()
    assert mine.startswith(f"koordqos-demo-{os.getpid()}-")
    assert owner_alive(mine) is True
    pid, ticks = _dead_pid()
    assert owner_alive(f"koordqos-demo-{pid}-{ticks}-abcdef12") is False
    # a live pid with another start time is a reused pid: not the owner
    assert owner_alive(f"koordqos-demo-{os.getpid()}-1-abcdef12") is False
    assert owner_alive("koordqos-demo-0123456789ab") is None  # an older name: owner unknown, left alone
    assert owner_alive("koordqos-demo-test") is None


@pytest.mark.parametrize("version", [CgroupVersion.V1, CgroupVersion.V2])
def test_sweep_removes_only_the_trees_of_gone_demos(tmp_path: Path, version: CgroupVersion) -> None:
    root = v1_root(tmp_path) if version is CgroupVersion.V1 else v2_root(tmp_path)
    pid, ticks = _dead_pid()
    stale = PodTree(name=f"koordqos-demo-{pid}-{ticks}-0000aaaa", root=root, version=version)
    live = PodTree(root=root, version=version)
    unknown = PodTree(name="koordqos-demo-0123456789ab", root=root, version=version)
    for tree in (stale, live, unknown):
        tree.create(cpus=2, ls_request_milli=1000)
    assert stale_trees(root, version) == [stale.name]
    # on a plain directory tree rmdir needs the files gone; on cgroupfs the kernel's files go with the dir
    for base in stale.mount_sources().values():
        for dirpath, _dirs, files in os.walk(base):
            for f in files:
                os.unlink(os.path.join(dirpath, f))
    assert sweep_stale(root, version) == [stale.name]
    assert not stale.exists()
    assert live.exists()
    assert unknown.exists()
    assert sweep_stale(root, version) == []
