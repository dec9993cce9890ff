"""CgroupReader and FileSet open beneath the cgroup root without following symlinks; FileSets follow a
cgroup removed and made again, and count against the open-file cap."""

from __future__ import annotations

import os
from pathlib import Path

from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.reader import CgroupReader, default_max_open_files, read_procs
from koordqos.cgroups.resources import CgroupVersion
from koordqos.testing.nodefs import SyntheticNode


def _swap_for_symlink(node: SyntheticNode, rel: str, target: str) -> None:
    """Replace `rel`'s dir in every hierarchy by a symlink to `target`'s (inside the root)."""
    for sub in node.hierarchies:
        base = node.cgroup_root / sub if sub else node.cgroup_root
        d = base / rel
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
        os.symlink(base / target, d)


def test_a_dir_swapped_for_a_symlink_is_refused_even_inside_the_root(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    guaranteed, _burstable, be = node.layout.qos_dirs()
    node.add_cpu_usage(guaranteed, 7)
    node.write(guaranteed, "cpu", "cgroup.procs", "1\n2\n")
    reader = CgroupReader(node.layout)
    assert reader.cpu_usage_ns(be) == 0
    reader.forget(be)  # a fresh look (a cached open file would still be the old dir's)
    _swap_for_symlink(node, be, guaranteed)
    assert reader.cpu_usage_ns(be) is None  # not 7: the symlinked component is not followed
    assert reader.memory_working_set(be) is None
    assert read_procs(node.layout, be) is None
    assert read_procs(node.layout, guaranteed) == [1, 2]
    files = reader.file_set([(be, "cpuacct", "cpuacct.usage"), (guaranteed, "cpuacct", "cpuacct.usage")])
    assert files.read() == [None, b"7\n"]
    files.close()


def test_file_set_rereads_follows_recreation_and_closes(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    rel = "kubepods/besteffort/podx"
    node.make_cgroup(rel)
    reader = CgroupReader(node.layout)
    files = reader.file_set([(rel, "cpuacct", "cpuacct.usage"), (rel, "memory", "memory.usage_in_bytes")])
    assert files.read() == [b"0\n", b"0\n"]
    assert reader.open_files == 2
    node.add_cpu_usage(rel, 5)
    assert files.read()[0] == b"5\n"  # the held fd sees the rewritten content
    node.remove_cgroup(rel)
    assert files.read() == [None, None]
    assert reader.open_files == 0
    node.make_cgroup(rel)  # made again under the same name: opened afresh from the root
    node.add_cpu_usage(rel, 3)
    assert files.read() == [b"3\n", b"0\n"]
    assert reader.open_files == 2
    files.close()
    assert reader.open_files == 0


def test_file_sets_share_the_open_file_cap(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    g, b, be = node.layout.qos_dirs()
    reader = CgroupReader(node.layout, max_open_files=3)
    one = reader.file_set([(g, "cpuacct", "cpuacct.usage"), (b, "cpuacct", "cpuacct.usage")])
    two = reader.file_set([(be, "cpuacct", "cpuacct.usage"), (be, "memory", "memory.usage_in_bytes")])
    assert one.read() == [b"0\n", b"0\n"]
    assert two.read() == [b"0\n", b"0\n"]  # the second file is read but not kept: cap reached
    assert reader.open_files == 3
    assert reader.cpu_usage_ns(g) == 0  # the reader's own reads obey the same cap
    assert reader.open_files == 3
    one.close()
    two.close()


def test_default_cap_leaves_room_for_other_fds() -> None:
    assert default_max_open_files(1024) == 256  # a shell's default: a quarter
    assert default_max_open_files(20_000) == 15_904  # all but 4,096
    assert default_max_open_files(1 << 20) == 16_384
    assert default_max_open_files(None) == 16_384
