"""The NodeMetric reporter's work over every pod runs in slices at 1,000 pods (issue #18: no loop step over
5 ms): the report history ingests a round in slices, and a report never begins in the middle of one; the pod
metadata of a report is kept per pod and rebuilt in slices. Structure, not timing: budgets are benchmarks."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

from koordqos.bus import EventBus
from koordqos.events.types import MetricTick
from koordqos.model.pod import parse_pod
from koordqos.report import history as history_mod
from koordqos.report import nodemetricreporter as reporters_mod
from koordqos.report.history import ReportHistory
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.state import NodeState
from tests.support.fake_apiserver import make_pod

from .conftest import FakeClock, GiB, feed, snapshot

PODS = 1000
WALL = 1796149800.0


def pods_state(n: int = PODS) -> NodeState:
    pods = {p.uid: p for p in (parse_pod(make_pod(f"p{i}", "node-a", uid=f"u{i}")) for i in range(n))}
    return NodeState(pods=MappingProxyType(pods))


def round_of(n: int = PODS, cpu: float = 0.002) -> object:
    """One round; the pods in the reverse of the report's order (by name), so a report that began in the
    middle of this round would meet the pods not yet ingested first."""
    order = sorted(range(n), key=lambda i: f"p{i}", reverse=True)
    return snapshot(4.0, 8 * GiB, {f"u{i}": (cpu, 1 << 20) for i in order})


def reporter(state: NodeState, clock: FakeClock) -> NodeMetricReporter:
    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    return NodeMetricReporter(
        EventBus(state=state), ReportHistory(1.0, clock=clock), None, wall=lambda: WALL, sleep=no_sleep
    )


def test_a_round_of_1000_pods_is_ingested_in_slices_with_the_same_result() -> None:
    clock = FakeClock()
    sliced, whole = ReportHistory(1.0, clock=clock), ReportHistory(1.0, clock=clock)
    snap = round_of()
    steps = sum(1 for _ in sliced.ingest_steps(snap))  # type: ignore[arg-type]
    whole.ingest(snap)  # type: ignore[arg-type]
    assert steps == PODS // history_mod.PODS_PER_STEP
    assert sliced.pods.keys() == whole.pods.keys()
    for name, series in whole.node.items():
        assert sliced.node[name].window(0.0, clock.t) == series.window(0.0, clock.t)


async def test_a_report_waits_for_a_round_in_progress() -> None:
    clock = FakeClock()
    state = pods_state()
    r = reporter(state, clock)
    feed(r.history, clock, 30, round_of())  # type: ignore[arg-type]
    r._inputs(state)  # the pod metadata is ready: the report would go straight to the usage
    clock.t += 1.0
    tick = asyncio.create_task(r._on_tick_paced(MetricTick(at=clock.t, sample=round_of(cpu=1.0)), state))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the round has begun: its first slice is in, the rest is not
    assert not tick.done()
    status = await r.build_async(state)
    assert tick.done()  # the report began only after the round
    assert isinstance(status, dict)
    # every pod's usage has the round's 1-core point: (30 × 2 + 1000) / 31 millicores (2m without it)
    usage = {p["name"]: p["podUsage"]["resources"]["cpu"] for p in status["podsMetric"]}
    assert len(usage) == PODS
    assert set(usage.values()) == {"34m"}
    # and the system usage its point, derived at the end of the round: 4 − 1000 cores → 0, so (30 × 2) / 31
    assert status["nodeMetric"]["systemUsage"]["resources"]["cpu"] == "1935m"


def test_report_metadata_is_rebuilt_in_slices_and_only_for_changed_pods() -> None:
    clock = FakeClock()
    state = pods_state()
    r = reporter(state, clock)
    assert sum(1 for _ in r._meta_steps(state.pods)) == PODS // reporters_mod.PODS_PER_STEP
    first, _ = r._inputs(state)
    assert sum(1 for _ in r._meta_steps(state.pods)) == 0  # the same pods mapping: nothing to do
    changed = dict(state.pods)
    changed["u7"] = parse_pod(make_pod("p7", "node-a", uid="u7", qos="BE"))
    again, _ = r._inputs(NodeState(pods=MappingProxyType(changed)))
    assert [m.qos for m in again if m.uid == "u7"] == ["BE"]
    kept = sum(1 for a, b in zip(first, again, strict=True) if a is b)
    assert kept == PODS - 1  # one PodMeta made anew, the others reused
