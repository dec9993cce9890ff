"""A dry-run decides as a real run would (issue #32 item 5g): the executor notes what it would have written
(cgroups/dryrun.py) and reads it back, so a repeated write is one decision and the next decisions follow from
the would-be values; the files themselves never change."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.decisions import DecisionLog
from koordqos.testing.nodefs import SyntheticNode

BE = "kubepods/besteffort"
POD = f"{BE}/podp"
QUOTA = "cpu.cfs_quota_us"


def executor(node: SyntheticNode, dry_run: bool) -> CgroupExecutor:
    return CgroupExecutor(node.layout, DecisionLog(dry_run=dry_run))


def fields(ex: CgroupExecutor) -> list[tuple[object, ...]]:
    return [(d.strategy, d.target, d.action, d.old, d.new, d.reason) for d in ex.decisions.recent()]


async def test_a_repeated_dry_run_write_is_one_decision_and_reads_back_its_value(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex = executor(node, dry_run=True)
    reader = CgroupReader(node.layout, dry_run_files=ex.dry_run_files)
    w = CgroupWrite(BE, QUOTA, "260000", Level.QOS, cacheable=False)
    outcomes = [(await ex.update("CPUSuppress", w)).outcome for _ in range(3)]
    assert outcomes == [Outcome.DRY_RUN, Outcome.UNCHANGED, Outcome.UNCHANGED]
    assert fields(ex) == [("CPUSuppress", f"{BE}/{QUOTA}", "write", "-1", "260000", "")]
    assert node.read(BE, "cpu", QUOTA) == "-1"  # nothing written
    assert ex.read_value(BE, QUOTA) == 260000
    assert reader.cpu_quota_period(BE) == (260000, 100000)
    assert CgroupReader(node.layout).cpu_quota_period(BE) == (-1, 100000)  # the file itself


async def test_a_file_changed_behind_a_dry_run_shows_again(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex = executor(node, dry_run=True)
    w = CgroupWrite(BE, QUOTA, "260000", Level.QOS, cacheable=False)
    await ex.update("CPUSuppress", w)
    node.write(BE, "cpu", QUOTA, 50000)  # someone else writes the file: a real run would see it too
    assert ex.read_value(BE, QUOTA) == 50000
    assert (await ex.update("CPUSuppress", w)).outcome is Outcome.DRY_RUN
    assert [d.old for d in ex.decisions.recent()] == ["-1", "50000"]


async def test_a_vanished_dir_forgets_its_would_be_values(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    node.make_cgroup(POD)
    ex = executor(node, dry_run=True)
    w = CgroupWrite(POD, "cpu.shares", "512", Level.POD, cacheable=False)
    await ex.update("s", w)
    assert len(ex.dry_run_files) == 1
    node.remove_cgroup(POD)
    assert (await ex.update("s", w)).outcome is Outcome.VANISHED
    assert len(ex.dry_run_files) == 0


async def _rounds(
    node: SyntheticNode, dry_run: bool, rounds: Sequence[Sequence[CgroupWrite]]
) -> CgroupExecutor:
    ex = executor(node, dry_run)
    for writes in rounds:
        await ex.apply("s", writes)
    return ex


async def test_leveled_batches_record_the_same_decisions_as_a_real_run(tmp_path: Path) -> None:
    """cpusets loosened top-down then set bottom-up, a quota and shares, planned again every round (as the
    strategies do): the dry-run's decisions are the real run's, round after round."""

    def batch(cpus: str, quota: str) -> list[CgroupWrite]:
        return [
            CgroupWrite(BE, "cpuset.cpus", cpus, Level.QOS, cacheable=False),
            CgroupWrite(POD, "cpuset.cpus", cpus, Level.POD, cacheable=False),
            CgroupWrite(BE, QUOTA, quota, Level.QOS, cacheable=False),
            CgroupWrite(POD, "cpu.shares", "2", Level.POD),
        ]

    plan = [batch("0-1", "200000"), batch("0-1", "200000"), batch("2-3", "240000"), batch("2-3", "240000")]
    nodes = []
    for name in ("real", "dry"):
        node = SyntheticNode(tmp_path / name, cpus=4)
        node.make_cgroup(POD)
        nodes.append(node)
    real = await _rounds(nodes[0], False, plan)
    dry = await _rounds(nodes[1], True, plan)
    assert fields(dry) == fields(real)
    assert [d.action for d in real.decisions.recent()].count("write-loosen") == 2  # 0-1 → 0-3 → 2-3
    assert len(real.decisions) == 9
    assert all(d.dry_run for d in dry.decisions.recent())
    assert nodes[1].read(BE, "cpuset", "cpuset.cpus") == "0-3"  # the dry-run node is as it was
    assert nodes[1].read(BE, "cpu", QUOTA) == "-1"


async def test_v2_would_be_values_read_back_through_the_reader(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, CgroupVersion.V2)
    ex = executor(node, dry_run=True)
    reader = CgroupReader(node.layout, dry_run_files=ex.dry_run_files)
    await ex.update("s", CgroupWrite(BE, QUOTA, "150000", Level.QOS, cacheable=False))
    assert reader.cpu_quota_period(BE) == (150000, 100000)
    assert node.read(BE, "cpu", "cpu.max").split()[0] == "max"


async def test_a_real_run_notes_nothing(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex = executor(node, dry_run=False)
    await ex.update("s", CgroupWrite(BE, QUOTA, "260000", Level.QOS, cacheable=False))
    assert len(ex.dry_run_files) == 0
    assert node.read(BE, "cpu", QUOTA) == "260000"
