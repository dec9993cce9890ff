"""The collector's hot-path parsing and reading: `lru_of` against the per-key parse it replaces (generated
memory.stat files and the real kernel's), `FileSet` size hints and its one-line read path (synthetic trees and
real kernfs scratch cgroups)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.parse import (
    cpu_stat_of,
    lru_of,
    memory_figures_of,
    stat_value_bytes,
    throttle_counts_of,
    working_set_of,
)
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.scratchcg import REAL_SUBSYSTEMS, Scratch

LRU = ("inactive_anon", "active_anon", "inactive_file", "active_file", "unevictable")
OTHER = ("cache", "rss", "shmem", "anon", "file", "pgfault", "slab_reclaimable", "workingset_refault_anon")


def per_key(stat: bytes, v2: bool) -> tuple[int, ...]:
    """The reference: each key searched for on its own (what memory_readings_of did before)."""
    prefix = b"" if v2 else b"total_"
    return tuple(stat_value_bytes(stat, prefix + k.encode()) or 0 for k in LRU)


number = st.integers(min_value=0, max_value=2**63).map(str)
value = st.one_of(number, st.sampled_from(["x", "-", "", "12 34", "1e3", " 7"]))


@st.composite
def memory_stat(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A memory.stat: as the kernel writes it (every key, the five LRU lists consecutive, v1 totals last),
    or with keys missing, shuffled or malformed values."""
    v2 = draw(st.booleans())
    names = list(LRU) + list(OTHER)
    if not v2:
        names = list(OTHER) + list(LRU) + ["hierarchical_memory_limit"] + [f"total_{n}" for n in OTHER + LRU]
    layout = draw(st.sampled_from(["kernel", "sparse", "shuffled", "junk"]))
    if layout in ("sparse", "shuffled"):
        keep = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
        names = [n for n, k in zip(names, keep, strict=True) if k or draw(st.booleans())]
    if layout == "shuffled":
        names = draw(st.permutations(names))
    values = value if layout == "junk" else number
    lines = [f"{n} {draw(values)}" for n in names]
    text = "\n".join(lines) + ("\n" if draw(st.booleans()) else "")
    return text.encode(), v2


_V1_LRU = b"x 0\ntotal_inactive_anon 0\ntotal_active_anon 0\ntotal_inactive_file 0\ntotal_active_file 0\n"


@given(memory_stat())
# found by CI: the last of the five lines with two words for a value (a split into words read it as 12)
@example((_V1_LRU + b"total_unevictable 12 34", False))
@example((_V1_LRU + b"total_unevictable", False))  # and without one
@example(
    (b"x 0\ninactive_anon 1\nactive_anon 2\ninactive_file 3\nactive_file 4\nunevictable 5 6\nx 7\n", True)
)
def test_lru_of_equals_the_per_key_parse(case: tuple[bytes, bool]) -> None:
    stat, v2 = case
    assert lru_of(stat, v2) == per_key(stat, v2)


CPU_STAT = ("usage_usec", "nr_periods", "nr_throttled", "throttled_time", "throttled_usec", "nr_bursts")


@given(
    st.permutations(CPU_STAT).flatmap(
        lambda keys: st.tuples(*(st.tuples(st.just(k), value, st.booleans()) for k in keys))
    )
)
def test_throttle_counts_of_equals_cpu_stat_of(lines: tuple[tuple[str, str, bool], ...]) -> None:
    data = "".join(f"{k} {v}\n" for k, v, keep in lines if keep).encode()
    stat = cpu_stat_of(data)
    assert throttle_counts_of(data) == (None if stat is None else (stat.nr_periods, stat.nr_throttled))


def test_lru_of_reads_the_kernel_layout() -> None:
    v1 = b"cache 1\ninactive_anon 9\ntotal_cache 2\ntotal_inactive_anon 10\ntotal_active_anon 20\n"
    v1 += b"total_inactive_file 30\ntotal_active_file 40\ntotal_unevictable 50\n"
    assert lru_of(v1, False) == (10, 20, 30, 40, 50)
    v2 = b"anon 5\nfile 6\ninactive_anon 1\nactive_anon 2\ninactive_file 3\nactive_file 4\nunevictable 0\n"
    v2 += b"slab_reclaimable 7\n"
    assert lru_of(v2, True) == (1, 2, 3, 4, 0)
    assert memory_figures_of(b"100\n", v2, True) == (97, 3, 10)
    assert memory_figures_of(b"2\n", v2, True) == (0, 3, 10)  # never below 0
    assert memory_figures_of(b"100\n", None, True) == (100, None, None)
    assert memory_figures_of(None, v2, True) is None
    assert working_set_of(b"100\n", v1, False) == 70
    assert working_set_of(b"100\n", b"total_inactive_file 30", False) == 70  # first line, no newline
    assert working_set_of(b"100\n", b"cache 1\n", False) == 100


@pytest.mark.cgroupv1
def test_lru_of_on_the_real_kernel(scratch: Scratch) -> None:
    """Real v1 memory.stat files (the root's, with every key non-zero, and a fresh cgroup's)."""
    for rel in ("", scratch.name):
        stat = scratch.path(rel, "memory", "memory.stat").read_bytes()
        assert lru_of(stat, False) == per_key(stat, False)
    root = scratch.path("", "memory", "memory.stat").read_bytes()
    assert sum(lru_of(root, False)) > 0
    cpu = scratch.path("", "cpu", "cpu.stat").read_bytes()
    stat = cpu_stat_of(cpu)
    assert stat is not None
    assert throttle_counts_of(cpu) == (stat.nr_periods, stat.nr_throttled)


def test_a_file_that_outgrows_its_size_hint_is_read_whole(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    rel = "kubepods/besteffort/podx"
    node.make_cgroup(rel)
    for check_links in (True, False):  # False: the one-line path kernfs takes
        reader = CgroupReader(node.layout)
        reader._check_links = check_links
        node.write(rel, "memory", "memory.stat", "total_inactive_file 1")
        files = reader.file_set([(rel, "cpuacct", "cpuacct.usage"), (rel, "memory", "memory.stat")])
        assert files.read() == [b"0\n", b"total_inactive_file 1\n"]  # both read for 64 bytes from now on
        assert files.read() == [b"0\n", b"total_inactive_file 1\n"]
        assert files._ready is not check_links
        node.write(rel, "memory", "memory.stat", "x" * 99)  # 100 bytes: past the hint, read again whole
        assert files.read()[1] == b"x" * 99 + b"\n"
        long = "\n".join(f"key{i} {i}" for i in range(500))  # 4.4 KB
        node.write(rel, "memory", "memory.stat", long)
        assert files.read()[1] == long.encode() + b"\n"
        assert files.read()[1] == long.encode() + b"\n"
        files.close()


@pytest.mark.cgroupv1
def test_file_set_on_kernfs_follows_a_removed_and_recreated_cgroup(scratch: Scratch) -> None:
    """On kernfs the reads take the one-line path; a removed cgroup (ENODEV) reads as None and one made
    again under the same name is opened afresh."""
    pod = scratch.mkcg("podx")
    reader = CgroupReader(scratch.layout)
    assert not reader._check_links
    files = reader.file_set(
        [(pod, "cpuacct", "cpuacct.usage"), (pod, "memory", "memory.stat"), (pod, "cpu", "cpu.stat")]
    )
    first = files.read()
    assert first[0] == b"0\n"
    assert first[1] is not None
    assert b"total_inactive_file " in first[1]
    assert files.read() == first  # nothing runs in it: the same bytes, read the one-line way
    assert files._ready
    for sub in REAL_SUBSYSTEMS:
        (scratch.root / sub / pod).rmdir()
    assert files.read() == [None, None, None]
    assert reader.open_files == 0
    assert not files._ready
    scratch.mkcg("podx")
    assert files.read() == first
    assert files._ready
    files.close()
    assert reader.open_files == 0
