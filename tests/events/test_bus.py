"""EventBus: per-subscriber order, tick coalescing, no loss of state events, subscriber isolation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from koordqos.bus import EventBus
from koordqos.events.types import (
    MetricTick,
    PodDeleted,
    PodUpserted,
    SourceSynced,
)
from koordqos.model.pod import PodInfo
from koordqos.observability import REGISTRY
from koordqos.state import NodeState
from koordqos.testing.poll import wait_until


@pytest.fixture
async def bus() -> AsyncIterator[EventBus]:
    b = EventBus(queue_size=8)
    task = asyncio.create_task(b.run())
    yield b
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def pod(i: int) -> PodInfo:
    return PodInfo(uid=f"uid-{i}", namespace="ns", name=f"p{i}")


async def test_each_subscriber_sees_its_events_in_publish_order(bus: EventBus) -> None:
    seen: dict[str, list[str]] = {"a": [], "b": []}
    bus.subscribe("a", lambda e, s: seen["a"].append(e.pod.uid), PodUpserted)
    bus.subscribe("b", lambda e, s: seen["b"].append(e.pod.uid), PodUpserted)
    for i in range(50):
        await bus.publish(PodUpserted(pod(i)))
    await bus.drained()
    expected = [f"uid-{i}" for i in range(50)]
    assert seen["a"] == expected
    assert seen["b"] == expected


async def test_state_is_reduced_before_fan_out(bus: EventBus) -> None:
    sizes: list[int] = []
    bus.subscribe("count", lambda e, s: sizes.append(len(s.pods)), PodUpserted, PodDeleted)
    await bus.publish(PodUpserted(pod(1)))
    await bus.publish(PodUpserted(pod(2)))
    await bus.publish(PodDeleted("uid-1"))
    await bus.drained()
    assert sizes == [1, 2, 1]
    assert set(bus.state.pods) == {"uid-2"}


async def test_slow_subscriber_gets_newest_tick_and_every_state_event(bus: EventBus) -> None:
    gate = asyncio.Event()
    seen: list[object] = []

    async def slow(event: object, state: NodeState) -> None:
        await gate.wait()
        seen.append(event)

    fast_ticks: list[float] = []
    bus.subscribe("slow", slow, MetricTick, PodUpserted, queue_size=1000)
    bus.subscribe("fast", lambda e, s: fast_ticks.append(e.at), MetricTick)
    await bus.publish(MetricTick(at=0.0))
    # wait until the slow subscriber is blocked on the first tick
    await wait_until(
        lambda: bus.subscriptions[0].busy,
        timeout=2,
        interval=0,
        message="the slow subscriber to block on the first tick",
    )
    for i in range(1, 101):
        await bus.publish(MetricTick(at=float(i)))
        if i % 10 == 0:
            await bus.publish(PodUpserted(pod(i)))
    await bus.publish(MetricTick(at=1000.0))
    gate.set()
    await bus.drained()
    ticks = [e.at for e in seen if isinstance(e, MetricTick)]
    pods = [e.pod.uid for e in seen if isinstance(e, PodUpserted)]
    assert pods == [f"uid-{i}" for i in range(10, 101, 10)]  # no state event lost, in order
    assert ticks == [0.0, 1000.0]  # the backlog of ticks coalesced into the newest
    assert fast_ticks[-1] == 1000.0  # the fast subscriber was not held back by the slow one


async def test_a_full_queue_makes_the_publisher_wait_instead_of_dropping(bus: EventBus) -> None:
    gate = asyncio.Event()
    seen: list[str] = []

    async def slow(event: PodUpserted, state: NodeState) -> None:
        await gate.wait()
        seen.append(event.pod.uid)

    bus.subscribe("slow", slow, PodUpserted, queue_size=4)
    publisher = asyncio.create_task(_publish_many(bus, 20))
    await wait_until(
        lambda: len(bus.subscriptions[0].queue) >= 4, timeout=2, interval=0, message="the slow queue to fill"
    )
    assert not publisher.done()  # back-pressure: the publisher waits for room
    gate.set()
    await asyncio.wait_for(publisher, 5)
    await bus.drained()
    assert seen == [f"uid-{i}" for i in range(20)]


async def _publish_many(bus: EventBus, n: int) -> None:
    for i in range(n):
        await bus.publish(PodUpserted(pod(i)))


async def test_raising_subscriber_is_isolated(bus: EventBus) -> None:
    good: list[str] = []

    def bad(event: PodUpserted, state: NodeState) -> None:
        raise RuntimeError("boom")

    sub = bus.subscribe("bad", bad, PodUpserted)
    bus.subscribe("good", lambda e, s: good.append(e.pod.uid), PodUpserted)
    await bus.publish(PodUpserted(pod(1)))
    await bus.publish(PodUpserted(pod(2)))
    await bus.drained()
    assert good == ["uid-1", "uid-2"]
    assert sub.failed == 2


async def test_subscriber_sees_only_its_types(bus: EventBus) -> None:
    seen: list[str] = []
    bus.subscribe("synced", lambda e, s: seen.append(e.source), SourceSynced)
    await bus.publish(PodUpserted(pod(1)))
    await bus.publish(SourceSynced("pods"))
    await bus.drained()
    assert seen == ["pods"]


async def test_duplicate_names_are_refused() -> None:
    bus = EventBus()
    bus.subscribe("x", lambda e, s: None)
    with pytest.raises(ValueError, match="already"):
        bus.subscribe("x", lambda e, s: None)


# -- immediate delivery -------------------------------------------------------------------------------


async def test_an_idle_subscriber_takes_the_event_in_the_publishers_step(bus: EventBus) -> None:
    taken: list[tuple[str, int]] = []
    queued: list[str] = []
    bus.subscribe(
        "a",
        lambda e, s: queued.append(e.pod.uid),
        PodUpserted,
        immediate=lambda e, s: taken.append((e.pod.uid, s.generation)) is None,
    )
    await wait_until(lambda: bus.running, message="the bus runs")
    bus.publish_nowait(PodUpserted(pod(1)))
    assert taken == [("uid-1", bus.state.generation)]  # before publish returned, with the state after it
    await bus.publish(PodUpserted(pod(2)))
    assert [u for u, _ in taken] == ["uid-1", "uid-2"]
    await bus.drained()
    assert queued == []
    assert bus.subscriptions[0].handled == 2


async def test_what_the_immediate_handler_declines_goes_to_the_task(bus: EventBus) -> None:
    seen: list[str] = []
    bus.subscribe(
        "a",
        lambda e, s: seen.append(f"task:{e.pod.uid}"),
        PodUpserted,
        immediate=lambda e, s: e.pod.uid == "uid-1" and seen.append(f"now:{e.pod.uid}") is None,
    )
    await wait_until(lambda: bus.running, message="the bus runs")
    for i in range(3):
        bus.publish_nowait(PodUpserted(pod(i)))
    await bus.drained()
    # uid-0 was declined and queued: uid-1 found it queued, so it queued behind it (order kept)
    assert seen == ["task:uid-0", "task:uid-1", "task:uid-2"]


async def test_a_busy_subscriber_keeps_its_order(bus: EventBus) -> None:
    seen: list[str] = []
    release = asyncio.Event()

    async def slow(e: PodUpserted, s: NodeState) -> None:
        if e.pod.uid == "uid-0":
            await release.wait()
        seen.append(f"task:{e.pod.uid}")

    bus.subscribe("a", slow, PodUpserted, immediate=lambda e, s: seen.append(f"now:{e.pod.uid}") is None)
    await wait_until(lambda: bus.running, message="the bus runs")
    sub = bus.subscriptions[0]
    sub.queue.append((PodUpserted(pod(0)), bus.state))  # as if published before the bus ran
    sub.wakeup.set()
    await wait_until(lambda: sub.busy, message="the slow handler runs")
    bus.publish_nowait(PodUpserted(pod(1)))  # the subscriber is busy: queued, not taken now
    assert seen == []
    release.set()
    await bus.drained()
    assert seen == ["task:uid-0", "task:uid-1"]
    bus.publish_nowait(PodUpserted(pod(2)))  # idle again: taken now
    assert seen[-1] == "now:uid-2"


def errors_of(subscriber: str) -> float:
    return (
        REGISTRY.get_sample_value("koordqos_bus_subscriber_errors_total", {"subscriber": subscriber}) or 0.0
    )


async def test_a_failing_immediate_handler_is_counted_and_the_others_still_get_the_event(
    bus: EventBus,
) -> None:
    def boom(e: PodUpserted, s: NodeState) -> bool:
        raise RuntimeError("boom")

    got: list[str] = []
    bus.subscribe("bad", lambda e, s: None, PodUpserted, immediate=boom)
    bus.subscribe(
        "good", lambda e, s: None, PodUpserted, immediate=lambda e, s: got.append(e.pod.uid) is None
    )
    await wait_until(lambda: bus.running, message="the bus runs")
    before = errors_of("bad")
    bus.publish_nowait(PodUpserted(pod(1)))
    bus.publish_nowait(PodUpserted(pod(2)))
    assert got == ["uid-1", "uid-2"]
    assert bus.subscriptions[0].failed == 2
    assert errors_of("bad") == before + 2


async def test_before_the_bus_runs_events_wait_in_the_queue() -> None:
    bus = EventBus()
    seen: list[str] = []
    bus.subscribe(
        "a",
        lambda e, s: seen.append(f"task:{e.pod.uid}"),
        PodUpserted,
        immediate=lambda e, s: seen.append("now") is None,
    )
    bus.publish_nowait(PodUpserted(pod(1)))
    assert seen == []
    task = asyncio.create_task(bus.run())
    try:
        await wait_until(lambda: seen == ["task:uid-1"], message="the queued event handled by the task")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
