"""The Node Event of a CPU-suppress change, from one round's write results."""

from __future__ import annotations

from koordqos.cgroups.executor import CgroupWrite, Outcome, WriteResult
from koordqos.strategies.suppressevents import (
    EVENT_REASON,
    EVENT_REASON_RECOVERED,
    node_reference,
    suppress_event,
)

BE = "kubepods/besteffort"


def result(parent: str, resource: str, value: str, outcome: Outcome, old: str | None = None) -> WriteResult:
    return WriteResult(CgroupWrite(parent, resource, value), outcome, old=old, new=value)


def test_a_quota_change_of_the_besteffort_dir_is_an_event() -> None:
    ev = suppress_event([result(BE, "cpu.cfs_quota_us", "240000", Outcome.WRITTEN, old="-1")], BE)
    assert ev == (EVENT_REASON, "best-effort CPU quota -1 → 240000 µs (2.40 cores)")


def test_recovery_to_unlimited_has_its_own_reason() -> None:
    ev = suppress_event([result(BE, "cpu.cfs_quota_us", "-1", Outcome.WRITTEN, old="2000")], BE)
    assert ev == (EVENT_REASON_RECOVERED, "best-effort CPU quota restored to unlimited")


def test_nothing_landed_no_event() -> None:
    for outcome in (Outcome.UNCHANGED, Outcome.CACHED, Outcome.FAILED, Outcome.DRY_RUN):
        assert suppress_event([result(BE, "cpu.cfs_quota_us", "2000", outcome, old="4000")], BE) is None
    # a pod-level cpuset recovery is not the cap
    assert (
        suppress_event([result(f"{BE}/podx", "cpuset.cpus", "0-3", Outcome.WRITTEN, old="0-1")], BE) is None
    )
    assert suppress_event([], BE) is None


def test_a_cpuset_change_of_the_besteffort_dir_is_an_event() -> None:
    ev = suppress_event([result(BE, "cpuset.cpus", "0-1", Outcome.WRITTEN, old="0-15")], BE)
    assert ev == (EVENT_REASON, "best-effort cpuset 0-15 → 0-1")


def test_the_event_is_on_the_node() -> None:
    assert node_reference("n1", "u1") == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
    assert "uid" not in node_reference("n1")
