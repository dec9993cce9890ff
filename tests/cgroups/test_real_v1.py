"""Executor and reader on this machine's real cgroup v1 hierarchy (scratch cgroups, removed afterwards)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from koordqos.cgroups import executor as executor_mod
from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import parse_cpuset
from koordqos.decisions import DecisionLog
from koordqos.testing.scratchcg import REAL_ROOT, Scratch

pytestmark = pytest.mark.cgroupv1


def online_cpus() -> frozenset[int]:
    return parse_cpuset((REAL_ROOT / "cpuset" / "cpuset.cpus").read_text())


async def test_write_and_read_quota_shares_cpuset(scratch: Scratch) -> None:
    pod = scratch.mkcg("pod1")
    ex = CgroupExecutor(scratch.layout, DecisionLog())
    cpu = min(online_cpus())
    results = await ex.apply(
        "test",
        [
            CgroupWrite(pod, "cpu.cfs_quota_us", 50000),
            CgroupWrite(pod, "cpu.shares", 512),
            CgroupWrite(pod, "cpuset.cpus", str(cpu)),
            CgroupWrite(pod, "memory.limit_in_bytes", 256 << 20),
        ],
    )
    assert [r.outcome for r in results] == [Outcome.WRITTEN] * 4, results
    assert scratch.read(pod, "cpu", "cpu.cfs_quota_us") == "50000"
    assert scratch.read(pod, "cpu", "cpu.shares") == "512"
    assert scratch.read(pod, "cpuset", "cpuset.cpus") == str(cpu)
    assert scratch.read(pod, "memory", "memory.limit_in_bytes") == str(256 << 20)
    reader = CgroupReader(scratch.layout)
    assert reader.cpu_quota_period(pod) == (50000, 100000)
    assert reader.cpuset(pod) == frozenset({cpu})
    assert ex.read_value(pod, "cpu.shares") == 512
    # back to unlimited
    results = await ex.apply(
        "test", [CgroupWrite(pod, "cpu.cfs_quota_us", -1), CgroupWrite(pod, "memory.limit_in_bytes", -1)]
    )
    assert [r.outcome for r in results] == [Outcome.WRITTEN] * 2
    assert scratch.read(pod, "cpu", "cpu.cfs_quota_us") == "-1"
    assert ex.read_value(pod, "memory.limit_in_bytes") == -1


def _check_nesting(scratch: Scratch, dirs: list[str]) -> None:
    """Assert no child is wider than its parent (quota and cpuset)."""
    for parent, child in itertools.pairwise(dirs):
        pq = int(scratch.read(parent, "cpu", "cpu.cfs_quota_us"))
        cq = int(scratch.read(child, "cpu", "cpu.cfs_quota_us"))
        assert pq == -1 or (cq != -1 and cq <= pq), (parent, pq, child, cq)
        pc = parse_cpuset(scratch.read(parent, "cpuset", "cpuset.cpus"))
        cc = parse_cpuset(scratch.read(child, "cpuset", "cpuset.cpus"))
        assert cc <= pc, (parent, pc, child, cc)


async def test_leveled_update_never_leaves_child_wider(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpus = sorted(online_cpus())
    if len(cpus) < 2:
        pytest.skip("needs at least 2 CPUs to shrink and widen a cpuset")
    qos = scratch.mkcg("qos")
    pod = scratch.mkcg("qos/pod")
    ctr = scratch.mkcg("qos/pod/ctr")
    dirs = [qos, pod, ctr]
    # start narrow: quota 50000/40000/30000, cpuset = first CPU
    for rel, q in zip(dirs, (50000, 40000, 30000), strict=True):
        (REAL_ROOT / "cpu" / rel / "cpu.cfs_quota_us").write_text(str(q))
    for rel in reversed(dirs):
        (REAL_ROOT / "cpuset" / rel / "cpuset.cpus").write_text(str(cpus[0]))
    real_write = executor_mod.write_file
    writes = 0

    def checked_write(path: str, text: str) -> None:
        nonlocal writes
        real_write(path, text)
        writes += 1
        _check_nesting(scratch, dirs)

    monkeypatch.setattr(executor_mod, "write_file", checked_write)
    ex = CgroupExecutor(scratch.layout, DecisionLog())
    levels = (Level.QOS, Level.POD, Level.CONTAINER)
    wide = f"{cpus[0]}-{cpus[1]}"

    # widen everything (input deliberately bottom-up: the executor must order it)
    batch = [
        CgroupWrite(d, "cpu.cfs_quota_us", q, lv)
        for d, q, lv in zip(dirs, (300000, 200000, 100000), levels, strict=True)
    ]
    batch += [CgroupWrite(d, "cpuset.cpus", wide, lv) for d, lv in zip(dirs, levels, strict=True)]
    results = await ex.apply("test", list(reversed(batch)))
    assert all(r.outcome is Outcome.WRITTEN for r in results), results
    # move to the other CPU and tighten quotas (input top-down this time)
    batch = [
        CgroupWrite(d, "cpu.cfs_quota_us", q, lv)
        for d, q, lv in zip(dirs, (30000, 20000, 10000), levels, strict=True)
    ]
    batch += [CgroupWrite(d, "cpuset.cpus", str(cpus[1]), lv) for d, lv in zip(dirs, levels, strict=True)]
    results = await ex.apply("test", batch)
    assert all(r.outcome is Outcome.WRITTEN for r in results), results
    assert [scratch.read(d, "cpuset", "cpuset.cpus") for d in dirs] == [str(cpus[1])] * 3
    assert [scratch.read(d, "cpu", "cpu.cfs_quota_us") for d in dirs] == ["30000", "20000", "10000"]
    assert writes >= 12


async def test_kernel_rejects_wrong_order_which_leveling_avoids(scratch: Scratch) -> None:
    """Control: written child-first, a wider child quota is refused by the kernel (so ordering matters)."""
    qos = scratch.mkcg("q")
    pod = scratch.mkcg("q/p")
    (REAL_ROOT / "cpu" / qos / "cpu.cfs_quota_us").write_text("50000")
    (REAL_ROOT / "cpu" / pod / "cpu.cfs_quota_us").write_text("40000")
    ex = CgroupExecutor(scratch.layout, DecisionLog())
    wrong = [
        CgroupWrite(pod, "cpu.cfs_quota_us", 200000, Level.POD),
        CgroupWrite(qos, "cpu.cfs_quota_us", 300000),
    ]
    results = await ex.apply_sequential("test", wrong)
    assert results[0].outcome is Outcome.FAILED
    assert "Invalid argument" in results[0].error
    leveled = [
        CgroupWrite(pod, "cpu.cfs_quota_us", 200000, Level.POD),
        CgroupWrite(qos, "cpu.cfs_quota_us", 300000, Level.QOS),
    ]
    assert all(r.outcome is not Outcome.FAILED for r in await ex.apply("test", leveled))
    assert scratch.read(pod, "cpu", "cpu.cfs_quota_us") == "200000"


async def test_unchanged_values_not_rewritten(scratch: Scratch, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = scratch.mkcg("pod")
    syscalls: list[str] = []
    real_write = executor_mod.write_file

    def counting(path: str, text: str) -> None:
        syscalls.append(Path(path).name)
        real_write(path, text)

    monkeypatch.setattr(executor_mod, "write_file", counting)
    ex = CgroupExecutor(scratch.layout, DecisionLog())
    w1 = CgroupWrite(pod, "cpu.cfs_quota_us", 70000, cacheable=False)
    w2 = CgroupWrite(pod, "cpu.shares", 333)
    first = await ex.apply("test", [w1, w2])
    assert [r.outcome for r in first] == [Outcome.WRITTEN, Outcome.WRITTEN]
    second = await ex.apply("test", [w1, w2])
    assert [r.outcome for r in second] == [Outcome.UNCHANGED, Outcome.CACHED]
    assert sorted(syscalls) == ["cpu.cfs_quota_us", "cpu.shares"]  # one write each, none repeated
    assert ex.file_writes == 2


async def test_vanished_dir_tolerated(scratch: Scratch) -> None:
    pod = scratch.mkcg("gone")
    for sub in ("cpu", "cpuacct", "cpuset", "memory"):
        (REAL_ROOT / sub / pod).rmdir()
    scratch.made.remove(pod)
    decisions = DecisionLog()
    ex = CgroupExecutor(scratch.layout, decisions)
    results = await ex.apply(
        "test", [CgroupWrite(pod, "cpu.shares", 2), CgroupWrite(pod, "cpuset.cpus", "0")]
    )
    assert [r.outcome for r in results] == [Outcome.VANISHED, Outcome.VANISHED]
    assert all(r.ok for r in results)
    assert len(decisions) == 0
    reader = CgroupReader(scratch.layout)
    assert reader.cpu_usage_ns(pod) is None
    assert reader.memory_working_set(pod) is None


def test_reader_counters_on_real_cgroup(scratch: Scratch) -> None:
    reader = CgroupReader(scratch.layout)
    usage = reader.cpu_usage_ns(scratch.name)
    assert usage is not None
    assert usage >= 0
    stat = reader.cpu_stat(scratch.name)
    assert stat is not None
    assert stat.nr_throttled <= stat.nr_periods
    ws = reader.memory_working_set(scratch.name)
    assert ws is not None
    assert ws >= 0


def test_reader_rereads_open_files_and_detects_removal(scratch: Scratch) -> None:
    reader = CgroupReader(scratch.layout)
    assert reader._check_links is False  # real cgroupfs: removal shows as ENODEV
    first = reader.cpu_usage_ns("")  # the hierarchy root: always accumulating
    sum(range(2_000_000))  # burn some CPU
    second = reader.cpu_usage_ns("")
    assert first is not None
    assert second is not None
    assert second > first  # pread at offset 0 regenerates the seq_file
    pod = scratch.mkcg("tmp")
    assert reader.cpu_usage_ns(pod) == 0
    opened = reader.open_files
    for sub in ("cpu", "cpuacct", "cpuset", "memory"):
        (REAL_ROOT / sub / pod).rmdir()
    scratch.made.remove(pod)
    assert reader.cpu_usage_ns(pod) is None
    assert reader.open_files == opened - 1
    reader.close()
