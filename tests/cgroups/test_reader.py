"""CgroupReader on synthetic v1 and v2 trees."""

from __future__ import annotations

from pathlib import Path

from koordqos.cgroups.parse import CpuStat, parse_flat_keyed, stat_value
from koordqos.cgroups.reader import CgroupReader, mount_fs_type
from koordqos.cgroups.resources import CgroupVersion
from koordqos.testing.nodefs import SyntheticNode


def test_counters(node: SyntheticNode) -> None:
    rel = node.layout.qos_dirs()[2]
    reader = CgroupReader(node.layout)
    assert reader.cpu_usage_ns(rel) == 0
    node.add_cpu_usage(rel, 2_500_000_000)
    assert reader.cpu_usage_ns(rel) == 2_500_000_000
    node.add_throttling(rel, 10, 3)
    stat = reader.cpu_stat(rel)
    assert stat == CpuStat(10, 3, 0)
    node.set_memory(rel, 1000, inactive_file=300)
    assert reader.memory_usage(rel) == 1000
    assert reader.memory_working_set(rel) == 700
    node.set_memory(rel, 100, inactive_file=300)
    assert reader.memory_working_set(rel) == 0  # never below 0


def test_settings(node: SyntheticNode) -> None:
    rel = node.layout.qos_dirs()[2]
    reader = CgroupReader(node.layout)
    # v2 with an empty cpuset.cpus falls back to cpuset.cpus.effective
    assert reader.cpuset(rel) == frozenset(range(4))
    assert reader.cpu_quota_period(rel) == (-1, 100000)
    if node.version is CgroupVersion.V1:
        node.write(rel, "cpu", "cpu.cfs_quota_us", 20000)
    else:
        node.write(rel, "cpu", "cpu.max", "20000 100000")
    assert reader.cpu_quota_period(rel) == (20000, 100000)


def test_missing_and_garbage_are_none(node: SyntheticNode) -> None:
    reader = CgroupReader(node.layout)
    gone = node.layout.qos_dirs()[2] + "/podgone"
    assert reader.cpu_usage_ns(gone) is None
    assert reader.cpu_stat(gone) is None
    assert reader.memory_working_set(gone) is None
    assert reader.cpuset(gone) is None
    assert reader.cpu_quota_period(gone) is None
    rel = node.layout.qos_dirs()[1]
    node.write(rel, "cpuset", "cpuset.cpus", "garbage")
    assert reader.cpuset(rel) is None
    assert reader.cpu_usage_ns("../../etc") is None  # refused path reads as missing


def test_stat_parsing() -> None:
    text = "cache 5\ntotal_inactive_file 42\ninactive_file 7\n"
    assert stat_value(text, "inactive_file") == 7
    assert stat_value(text, "total_inactive_file") == 42
    assert stat_value(text, "cache") == 5
    assert stat_value(text, "missing") is None
    assert parse_flat_keyed("a 1\nb x\nc 3") == {"a": 1, "c": 3}


def test_open_files_are_reused_and_refreshed(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    reader = CgroupReader(node.layout)
    rel = node.layout.qos_dirs()[2]
    assert reader.cpu_usage_ns(rel) == 0
    assert reader.open_files == 1
    node.add_cpu_usage(rel, 5)  # rewritten in place: the cached descriptor sees the new value
    assert reader.cpu_usage_ns(rel) == 5
    assert reader.open_files == 1
    node.remove_cgroup(rel)  # unlinked: detected by link count, not served stale
    assert reader.cpu_usage_ns(rel) is None
    assert reader.open_files == 0
    reader.close()


def test_open_file_cap_and_forget(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    reader = CgroupReader(node.layout, max_open_files=2)
    g, b, be = node.layout.qos_dirs()
    for rel in (g, b, be):
        assert reader.cpu_usage_ns(rel) == 0
        assert reader.memory_usage(rel) == 0
    assert reader.open_files == 2  # beyond the cap files are opened and closed per read
    reader.forget("kubepods")
    assert reader.open_files == 0
    assert reader.cpu_usage_ns(be) == 0


def test_forget_takes_many_dirs_and_only_those_dirs_and_below(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    reader = CgroupReader(node.layout)
    _g, _b, be = node.layout.qos_dirs()
    pods = [f"{be}/pod{i}" for i in (1, 10, 2)]
    for rel in pods:
        node.make_cgroup(rel)
        node.make_cgroup(f"{rel}/c")
        node.write(rel, "cpuacct", "cpuacct.usage", 5)
        node.write(f"{rel}/c", "cpuacct", "cpuacct.usage", 7)
        assert reader.cpu_usage_ns(rel) == 5
        assert reader.cpu_usage_ns(f"{rel}/c") == 7
    held = reader.open_files
    reader.forget(f"{be}/pod1", f"{be}/pod2")  # pods that left together: one pass
    assert reader.open_files == held - 4  # each pod's and its container's file
    kept = {rel for _sub, rel in reader._dirs}
    assert f"{be}/pod10" in kept  # a longer name with the same beginning is another dir
    assert f"{be}/pod10/c" in kept
    assert not {f"{be}/pod1", f"{be}/pod1/c", f"{be}/pod2", f"{be}/pod2/c"} & kept
    reader.forget()  # nothing gone: nothing to do
    assert reader.open_files == held - 4
    reader.close()


def test_mount_fs_type(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        "31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    )
    assert mount_fs_type("/sys/fs/cgroup/cpu/kubepods", str(info)) == "cgroup"
    assert mount_fs_type("/sys/fs/cgroup/unified", str(info)) == "tmpfs"
    assert mount_fs_type("/home", str(info)) == "ext4"
    assert mount_fs_type("/x", str(tmp_path / "missing")) is None


def test_read_procs(node: SyntheticNode) -> None:
    from koordqos.cgroups.reader import read_procs

    rel = node.layout.qos_dirs()[2]
    node.write(rel, "cpu", "cgroup.procs", "10\n11\n\n12\n")
    assert read_procs(node.layout, rel) == [10, 11, 12]
    assert read_procs(node.layout, f"{rel}/gone") is None  # the dir does not exist (any more)
    assert read_procs(node.layout, "../escape") is None  # refused by the layout, not an exception
