"""/proc parsers and the CPU topology reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordqos.metrics.procfs import parse_meminfo, parse_proc_stat
from koordqos.metrics.topology import CpuInfo, read_topology
from koordqos.testing.nodefs import SyntheticNode


def test_parse_proc_stat() -> None:
    text = "cpu  10 1 5 100 7 2 3 4 0 0\ncpu0 5 0 2 50 3 1 1 2 0 0\ncpu1 5 1 3 50 4 1 2 2 0 0\nintr 1\n"
    ticks = parse_proc_stat(text)
    assert ticks is not None
    assert ticks.busy == 10 + 1 + 5 + 2 + 3  # user nice system irq softirq; not idle/iowait/steal
    assert ticks.online_cpus == 2
    assert parse_proc_stat("intr 1\n") is None
    assert parse_proc_stat("cpu  a b c\n") is None
    assert parse_proc_stat("cpu  1 2\n") is None


def test_parse_real_proc_stat() -> None:
    ticks = parse_proc_stat(Path("/proc/stat").read_text())
    assert ticks is not None
    assert ticks.online_cpus == os.cpu_count()


def test_parse_meminfo() -> None:
    mem = parse_meminfo("MemTotal:  1000 kB\nMemFree: 200 kB\nHugePages_Total: 0\nbogus\nX: y kB\n")
    assert mem == {"MemTotal": 1024000, "MemFree": 204800, "HugePages_Total": 0}


def test_topology_from_synthetic_sys(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, cpus=4)
    topo = read_topology(node.sys_root)
    assert topo.cpus == (CpuInfo(0, 0, 0, 0), CpuInfo(1, 0, 0, 0), CpuInfo(2, 1, 0, 0), CpuInfo(3, 1, 0, 0))
    assert topo.by_core() == {(0, 0): (0, 1), (0, 1): (2, 3)}
    assert topo.by_node() == {0: (0, 1, 2, 3)}
    assert topo.cpu_ids == frozenset(range(4))


def test_topology_numa_nodes(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, cpus=4)
    base = node.sys_root / "devices/system/cpu"
    for i in (2, 3):
        (base / f"cpu{i}" / "node0").rmdir()
        (base / f"cpu{i}" / "node1").mkdir()
        (base / f"cpu{i}" / "topology/physical_package_id").write_text("1\n")
    topo = read_topology(node.sys_root)
    assert topo.by_node() == {0: (0, 1), 1: (2, 3)}
    assert [c.socket for c in topo.cpus] == [0, 0, 1, 1]


def test_topology_fallback_without_sysfs(tmp_path: Path) -> None:
    topo = read_topology(tmp_path / "empty", fallback_cpus=3)
    assert [c.cpu for c in topo.cpus] == [0, 1, 2]


def test_topology_of_this_machine() -> None:
    if not Path("/sys/devices/system/cpu/online").exists():
        pytest.skip("no /sys/devices/system/cpu/online on this machine")
    topo = read_topology("/sys")
    assert len(topo) == os.cpu_count()
