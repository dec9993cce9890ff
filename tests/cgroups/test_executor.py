"""CgroupExecutor on synthetic v1/v2 trees: conversions, write-if-different, cache, dry-run, leveled order."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from koordqos.cgroups import executor as executor_mod
from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.decisions import DecisionLog
from koordqos.testing.loopturns import counting
from koordqos.testing.nodefs import SyntheticNode

BE = "kubepods/besteffort"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(node: SyntheticNode, **kw: object) -> tuple[CgroupExecutor, DecisionLog, FakeClock]:
    decisions = DecisionLog()
    clock = FakeClock()
    return CgroupExecutor(node.layout, decisions, clock=clock, **kw), decisions, clock  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("resource", "value", "v1_file", "v1_text", "v2_file", "v2_text"),
    [
        ("cpu.shares", 2048, "cpu.shares", "2048", "cpu.weight", "79"),
        ("cpu.shares", 512, "cpu.shares", "512", "cpu.weight", "20"),
        ("cpu.cfs_quota_us", 50000, "cpu.cfs_quota_us", "50000", "cpu.max", "50000"),
        ("cpu.cfs_quota_us", 3000, "cpu.cfs_quota_us", "3000", "cpu.max", "3000"),
        ("cpuset.cpus", "0-1", "cpuset.cpus", "0-1", "cpuset.cpus", "0-1"),
        ("memory.limit_in_bytes", 1 << 30, "memory.limit_in_bytes", "1073741824", "memory.max", "1073741824"),
    ],
)
async def test_write_and_convert(
    node: SyntheticNode,
    resource: str,
    value: int | str,
    v1_file: str,
    v1_text: str,
    v2_file: str,
    v2_text: str,
) -> None:
    ex, decisions, _ = make(node)
    rel = node.layout.qos_dirs()[2]
    [res] = await ex.apply("s", [CgroupWrite(rel, resource, value, Level.QOS)], reason="r")
    assert res.outcome is Outcome.WRITTEN, res
    v1 = node.version is CgroupVersion.V1
    sub = resource.split(".", maxsplit=1)[0]
    assert node.read(rel, sub, v1_file if v1 else v2_file) == (v1_text if v1 else v2_text)
    [d] = decisions.recent()
    assert (d.strategy, d.target, d.action, d.new, d.reason, d.dry_run) == (
        "s",
        f"{rel}/{resource}",
        "write",
        v1_text if v1 else v2_text,
        "r",
        False,
    )


async def test_v2_unlimited_becomes_max(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    rel = node.layout.qos_dirs()[2]
    node.write(rel, "cpu", "cpu.max", "20000 100000")
    node.write(rel, "memory", "memory.max", "1073741824")
    ex, _, _ = make(node)
    results = await ex.apply(
        "s", [CgroupWrite(rel, "cpu.cfs_quota_us", -1), CgroupWrite(rel, "memory.limit_in_bytes", -1)]
    )
    assert [r.outcome for r in results] == [Outcome.WRITTEN, Outcome.WRITTEN]
    assert node.read(rel, "cpu", "cpu.max") == "max"
    assert node.read(rel, "memory", "memory.max") == "max"
    assert ex.read_value(rel, "cpu.cfs_quota_us") == -1


async def test_v2_period_written_with_current_quota(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, CgroupVersion.V2)
    node.write("kubepods", "cpu", "cpu.max", "50000 100000")
    ex, _, _ = make(node)
    [res] = await ex.apply("s", [CgroupWrite("kubepods", "cpu.cfs_period_us", 200000)])
    assert res.outcome is Outcome.WRITTEN
    assert node.read("kubepods", "cpu", "cpu.max") == "50000 200000"


async def test_write_if_different_skips_equal_content(node: SyntheticNode) -> None:
    ex, decisions, _ = make(node)
    rel = node.layout.qos_dirs()[2]
    node.write(rel, "cpuset", "cpuset.cpus", "0,1,2")
    [res] = await ex.apply("s", [CgroupWrite(rel, "cpuset.cpus", "0-2", cacheable=False)])
    assert res.outcome is Outcome.UNCHANGED
    assert ex.file_writes == 0
    assert len(decisions) == 0


async def test_cache_skips_reads_until_force_update(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex, _, clock = make(node, force_update_seconds=60.0)
    w = CgroupWrite(BE, "cpu.shares", 512)
    assert (await ex.update("s", w)).outcome is Outcome.WRITTEN
    reads = ex.file_reads
    node.write(BE, "cpu", "cpu.shares", 1024)  # external change
    clock.now += 59
    assert (await ex.update("s", w)).outcome is Outcome.CACHED
    assert ex.file_reads == reads  # cache hit: not even read
    assert node.read(BE, "cpu", "cpu.shares") == "1024"
    clock.now += 2  # past the force-update period: corrected
    assert (await ex.update("s", w)).outcome is Outcome.WRITTEN
    assert node.read(BE, "cpu", "cpu.shares") == "512"
    # a different value is never served from the cache
    assert (await ex.update("s", CgroupWrite(BE, "cpu.shares", 256))).outcome is Outcome.WRITTEN


async def test_the_write_cache_forgets_expired_entries_as_it_goes(tmp_path: Path) -> None:
    # containers come and go in a pod that stays (restarts): their entries must not pile up until the pod
    # goes, and expiring them must not be a sweep of the whole cache in one step
    node = SyntheticNode(tmp_path)
    ex, _, clock = make(node, force_update_seconds=60.0)
    live = CgroupWrite(BE, "cpu.shares", 512)
    for i in range(200):
        gone = f"{BE}/ctr{i}"
        node.make_cgroup(gone)
        assert (await ex.update("s", CgroupWrite(gone, "cpu.shares", 2))).outcome is Outcome.WRITTEN
        if i % 20 == 0:  # a container that stays is written again now and then
            assert (await ex.update("s", live)).ok
        clock.now += 1.0
    # one write a second for 200 s, each entry of use for 60 s: about the last 60 remain, not 200
    assert 60 <= len(ex._cache) <= 63, len(ex._cache)
    assert (BE, "cpu.shares") in ex._cache  # written 19 s ago: kept and served
    assert (await ex.update("s", live)).outcome is Outcome.CACHED
    assert (f"{BE}/ctr0", "cpu.shares") not in ex._cache
    assert (f"{BE}/ctr199", "cpu.shares") in ex._cache
    # the newest write of a dir within its period is still a cache hit
    assert (await ex.update("s", CgroupWrite(f"{BE}/ctr199", "cpu.shares", 2))).outcome is Outcome.CACHED
    whens = [when for _, when in ex._cache.values()]
    assert whens == sorted(whens)  # oldest first: what `_remember` expires from


async def test_non_cacheable_always_checks_file(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex, _, _ = make(node)
    w = CgroupWrite(BE, "cpu.shares", 512, cacheable=False)
    await ex.update("s", w)
    node.write(BE, "cpu", "cpu.shares", 1024)
    assert (await ex.update("s", w)).outcome is Outcome.WRITTEN
    assert node.read(BE, "cpu", "cpu.shares") == "512"


async def test_dry_run_writes_nothing_but_records(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    decisions = DecisionLog(dry_run=True)
    ex = CgroupExecutor(node.layout, decisions)
    [res] = await ex.apply("s", [CgroupWrite(BE, "cpu.cfs_quota_us", 20000, Level.QOS)], "why")
    assert res.outcome is Outcome.DRY_RUN
    assert node.read(BE, "cpu", "cpu.cfs_quota_us") == "-1"
    assert ex.file_writes == 0
    [d] = decisions.recent()
    assert (d.dry_run, d.old, d.new, d.reason) == (True, "-1", "20000", "why")


async def test_vanished_and_unsupported_are_not_errors(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex, decisions, _ = make(node)
    results = await ex.apply(
        "s",
        [
            CgroupWrite("kubepods/besteffort/podgone", "cpu.shares", 2),
            CgroupWrite(BE, "cpu.bvt_warp_ns", 2),  # not an Anolis kernel: no file
            CgroupWrite(BE, "memory.pagecache_limit.size", 1),  # v2 only
        ],
    )
    assert [r.outcome for r in results] == [Outcome.VANISHED, Outcome.UNSUPPORTED, Outcome.UNSUPPORTED]
    assert all(r.ok for r in results)
    assert len(decisions) == 0


async def test_extension_supported_when_file_exists(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, extensions={"cpu.bvt_warp_ns", "cpu.idle"})
    ex, _, _ = make(node)
    results = await ex.apply("s", [CgroupWrite(BE, "cpu.bvt_warp_ns", -1), CgroupWrite(BE, "cpu.idle", 1)])
    assert [r.outcome for r in results] == [Outcome.WRITTEN, Outcome.WRITTEN]
    assert node.read(BE, "cpu", "cpu.bvt_warp_ns") == "-1"


async def test_invalid_values_recorded_not_written(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex, decisions, _ = make(node)
    results = await ex.apply(
        "s",
        [
            CgroupWrite(BE, "cpu.shares", 1),
            CgroupWrite(BE, "cpu.nonsense", 1),
            CgroupWrite(BE, "cpuset.cpus", "x"),
        ],
    )
    assert [r.outcome for r in results] == [Outcome.INVALID] * 3
    assert node.read(BE, "cpu", "cpu.shares") == "1024"
    assert [d.action for d in decisions.recent()] == ["write-invalid"] * 3
    assert "out of range" in results[0].error


async def test_kernel_rejection_is_failed_and_recorded(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    path = node.path(BE, "cpu", "cpu.shares")
    path.chmod(0o444)
    ex, decisions, _ = make(node)
    try:
        if path.stat().st_uid == 0 and __import__("os").geteuid() == 0:
            # root ignores file modes: make the "file" a directory so the write fails with EISDIR
            path.chmod(0o644)
            path.unlink()
            path.mkdir()
        [res] = await ex.apply("s", [CgroupWrite(BE, "cpu.shares", 2)])
    finally:
        if path.is_file():
            path.chmod(0o644)
    assert res.outcome is Outcome.FAILED
    assert decisions.recent()[-1].action == "write-failed"


async def test_memory_limit_written_in_worker_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = SyntheticNode(tmp_path)
    threads: dict[str, int] = {}
    real = executor_mod.write_file

    def spy(path: str, text: str) -> None:
        threads[Path(path).name] = threading.get_ident()
        real(path, text)

    monkeypatch.setattr(executor_mod, "write_file", spy)
    ex, _, _ = make(node)
    await ex.apply("s", [CgroupWrite(BE, "memory.limit_in_bytes", 1 << 30), CgroupWrite(BE, "cpu.shares", 2)])
    assert threads["cpu.shares"] == threading.get_ident()
    assert threads["memory.limit_in_bytes"] != threading.get_ident()
    assert node.read(BE, "memory", "memory.limit_in_bytes") == str(1 << 30)


async def test_leveled_order_loosen_down_then_exact_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = SyntheticNode(tmp_path)
    pod, ctr = f"{BE}/podp", f"{BE}/podp/c1"
    node.make_cgroup(pod)
    node.make_cgroup(ctr)
    for rel, q in ((BE, 50000), (pod, 40000), (ctr, 30000)):
        node.write(rel, "cpu", "cpu.cfs_quota_us", q)
    order: list[tuple[str, str]] = []
    real = executor_mod.write_file

    def spy(path: str, text: str) -> None:
        order.append((str(Path(path).parent.relative_to(node.cgroup_root / "cpu,cpuacct")), text))
        real(path, text)

    monkeypatch.setattr(executor_mod, "write_file", spy)
    ex, decisions, _ = make(node)
    # shuffled input: container, qos, pod; loosen the pod (to 100000) and tighten the container (to 20000)
    writes = [
        CgroupWrite(ctr, "cpu.cfs_quota_us", 20000, Level.CONTAINER),
        CgroupWrite(BE, "cpu.cfs_quota_us", 60000, Level.QOS),
        CgroupWrite(pod, "cpu.cfs_quota_us", 100000, Level.POD),
        CgroupWrite(pod, "cpu.shares", 512, Level.POD),
    ]
    results = await ex.apply("s", writes)
    assert [r.write for r in results] == writes
    assert all(r.outcome is Outcome.WRITTEN for r in results)
    assert order == [
        (BE, "60000"),  # pass 1 top-down: larger of current/new
        (pod, "100000"),
        (pod, "512"),  # plain resources are written once, in pass 1
        (ctr, "20000"),  # pass 2 bottom-up exact (qos and pod already exact: unchanged)
    ]
    assert [d.action for d in decisions.recent()] == ["write"] * 4


async def test_leveled_cpuset_shrink_is_bottom_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = SyntheticNode(tmp_path, cpus=4)
    pod = f"{BE}/podp"
    node.make_cgroup(pod)
    order: list[str] = []
    real = executor_mod.write_file

    def spy(path: str, text: str) -> None:
        order.append(f"{Path(path).parent.name}={text}")
        real(path, text)

    monkeypatch.setattr(executor_mod, "write_file", spy)
    ex, _, _ = make(node)
    await ex.apply(
        "s",
        [CgroupWrite(BE, "cpuset.cpus", "0-1", Level.QOS), CgroupWrite(pod, "cpuset.cpus", "0-1", Level.POD)],
    )
    assert order == ["podp=0-1", "besteffort=0-1"]
    order.clear()
    await ex.apply(
        "s",
        [CgroupWrite(pod, "cpuset.cpus", "2-3", Level.POD), CgroupWrite(BE, "cpuset.cpus", "2-3", Level.QOS)],
    )
    # widen first (union) top-down, then exact bottom-up
    assert order == ["besteffort=0-3", "podp=0-3", "podp=2-3", "besteffort=2-3"]


async def test_invalidate_drops_cache(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex, _, _ = make(node)
    w = CgroupWrite(BE, "cpu.shares", 512)
    await ex.update("s", w)
    node.write(BE, "cpu", "cpu.shares", 1024)
    ex.invalidate(BE)
    assert (await ex.update("s", w)).outcome is Outcome.WRITTEN


async def test_invalidate_distrusts_the_dir_and_what_is_under_it_only(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex, _, clock = make(node, force_update_seconds=60.0)
    gone, ctr, sibling = f"{BE}/pod1", f"{BE}/pod1/c1", f"{BE}/pod10"  # pod10: pod1 is a prefix of its text
    writes = [CgroupWrite(d, "cpu.shares", 512) for d in (gone, ctr, sibling, BE)]
    for d in (gone, ctr, sibling):
        node.make_cgroup(d)
    for w in writes:
        assert (await ex.update("s", w)).outcome is Outcome.WRITTEN
    clock.now += 1
    ex.invalidate(gone)
    clock.now += 0.001
    outcomes = [(await ex.update("s", w)).outcome for w in writes]
    # the pod's dir and its container's are checked again; its sibling (same text prefix) and the QoS dir
    # above it are not
    assert outcomes == [Outcome.UNCHANGED, Outcome.UNCHANGED, Outcome.CACHED, Outcome.CACHED]
    # checked again, they are cached again
    assert [(await ex.update("s", w)).outcome for w in writes[:2]] == [Outcome.CACHED, Outcome.CACHED]
    # a dir made again with the kernel's default, invalidated in the same clock reading as the value was
    # cached: not trusted either
    clock.now += 1
    w256 = CgroupWrite(gone, "cpu.shares", 256)
    assert (await ex.update("s", w256)).outcome is Outcome.WRITTEN  # cached at this very reading
    node.write(gone, "cpu", "cpu.shares", 1024)
    ex.invalidate(gone)
    assert (await ex.update("s", w256)).outcome is Outcome.WRITTEN
    assert node.read(gone, "cpu", "cpu.shares") == "256"


async def test_invalidations_are_forgotten_after_a_period(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    ex, _, clock = make(node, force_update_seconds=60.0)
    for i in range(200):  # a pod removed every second
        ex.invalidate(f"{BE}/pod{i}")
        clock.now += 1.0
    assert 59 <= len(ex._invalidated) <= 61, len(ex._invalidated)
    assert f"{BE}/pod199" in ex._invalidated
    assert f"{BE}/pod0" not in ex._invalidated
    ex.invalidate()  # everything
    assert not ex._invalidated
    assert not ex._cache
    # with a force-update period of 0 nothing is cached and no mark is kept (and forgetting a pod works)
    ex0, _, _ = make(node, force_update_seconds=0.0)
    ex0.invalidate(f"{BE}/pod1")
    assert not ex0._invalidated


def test_read_helpers(node: SyntheticNode) -> None:
    ex, _, _ = make(node)
    rel = node.layout.qos_dirs()[2]
    assert ex.read_value(rel, "cpu.cfs_quota_us") == -1
    assert ex.read_value(rel, "cpu.cfs_period_us") == 100000
    assert ex.read_value(rel, "cpuset.cpus") == ("0-3" if node.version is CgroupVersion.V1 else "")
    assert ex.read_value(f"{rel}/gone", "cpu.shares") is None
    assert ex.read(f"{rel}/gone", "cpu.shares") is None


async def test_large_batches_yield_to_the_loop(node: SyntheticNode) -> None:
    """Cached or unchanged intents never await anything: a big batch must still give the loop a turn."""
    ex, _, _ = make(node)
    rel = node.layout.qos_dirs()[2]
    writes = [CgroupWrite(rel, "cpu.shares", 1024, Level.QOS)] * 450
    await ex.apply("s", writes[:1])  # now cached: the rest are no-ops that would never await
    async with counting() as turns:
        results = await ex.apply("s", writes)
    during_apply = turns.count
    async with counting() as turns:
        await ex.apply_sequential("s", writes)
    during_sequential = turns.count
    assert {r.outcome for r in results} == {Outcome.CACHED}
    assert during_apply >= 4  # 450 intents, a turn every 100
    assert during_sequential >= 4


async def test_a_cpu_idle_change_drops_the_cached_shares_of_the_dir(tmp_path: Path) -> None:
    """The kernel sets the weight of a group whose cpu.idle changes (seen in the v2 VM: idle 1 puts
    cpu.weight to 0, idle 0 back to 100): the next shares intent reads the file again, not the cache."""
    node = SyntheticNode(tmp_path, CgroupVersion.V2, extensions=("cpu.idle",))
    pod = "kubepods/besteffort/podu"
    node.make_cgroup(pod)
    ex, _, _ = make(node, force_update_seconds=60.0)
    shares = CgroupWrite(pod, "cpu.shares", 1024)
    assert (await ex.update("s", shares)).outcome is Outcome.WRITTEN
    assert node.read(pod, "cpu", "cpu.weight") == "39"
    assert (await ex.update("s", CgroupWrite(pod, "cpu.idle", 1))).outcome is Outcome.WRITTEN
    node.write(pod, "cpu", "cpu.weight", 0)  # what the kernel does
    assert (await ex.update("s", CgroupWrite(pod, "cpu.idle", 0))).outcome is Outcome.WRITTEN
    node.write(pod, "cpu", "cpu.weight", 100)  # and back to the default
    assert (await ex.update("s", shares)).outcome is Outcome.WRITTEN
    assert node.read(pod, "cpu", "cpu.weight") == "39"
    # an unchanged cpu.idle (no write) keeps the cache
    assert (await ex.update("s", CgroupWrite(pod, "cpu.idle", 0))).outcome is Outcome.CACHED
    assert (await ex.update("s", shares)).outcome is Outcome.CACHED
