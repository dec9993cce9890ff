"""EventBus: per-subscriber order, tick coalescing, no loss of state events, subscriber isolation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from koordqos.events.bus import EventBus
from koordqos.events.types import (
    MetricTick,
    PodDeleted,
    PodUpserted,
    SourceSynced,
)
from koordqos.model.pod import PodInfo
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
