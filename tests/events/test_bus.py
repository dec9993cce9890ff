"""EventBus: per-subscriber order, tick coalescing, no loss of state events, requests and failure policy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from koordqos.errors import HookError, TimeoutException
from koordqos.events import (
    EventBus,
    MetricTick,
    PodDeleted,
    PodUpserted,
    RequestEvent,
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


@dataclass
class Create(RequestEvent):
    trace: list[str] = field(default_factory=list)
    shares: int | None = None


async def test_request_runs_hooks_in_order_on_one_context() -> None:
    bus = EventBus()

    def hook(name: str, shares: int | None = None):  # type: ignore[no-untyped-def]
        def run(ev: Create, state: NodeState) -> None:
            ev.trace.append(name)
            if shares is not None:
                ev.shares = shares

        return run

    bus.register_hook(Create, "zeta", hook("zeta", 2), order=0)
    bus.register_hook(Create, "alpha", hook("alpha", 1), order=0)
    bus.register_hook(Create, "late", hook("late"), order=10)
    result = await bus.request(Create(), deadline=1.0)
    assert result.event.trace == ["alpha", "zeta", "late"]
    assert result.event.shares == 2  # last writer wins
    assert bus.hooks_for(Create) == ["alpha", "zeta", "late"]


async def test_hanging_hook_does_not_hang_the_request_under_ignore() -> None:
    bus = EventBus()

    def first(ev: Create, state: NodeState) -> None:
        ev.shares = 7

    async def hang(ev: Create, state: NodeState) -> None:
        await asyncio.Event().wait()

    bus.register_hook(Create, "a-first", first)
    bus.register_hook(Create, "b-hang", hang)
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await bus.request(Create(), deadline=0.05)
    elapsed = loop.time() - start
    assert result.timed_out
    assert result.event.shares == 7  # what completed hooks contributed is returned
    assert elapsed < 1.0  # generous: proves the deadline cut it, not a budget


async def test_hanging_hook_fails_the_request_under_fail() -> None:
    bus = EventBus()

    async def hang(ev: Create, state: NodeState) -> None:
        await asyncio.Event().wait()

    bus.register_hook(Create, "hang", hang)
    with pytest.raises(TimeoutException, match="hang"):
        await bus.request(Create(), deadline=0.05, policy="Fail")


async def test_raising_hook_is_skipped_under_ignore_and_fails_under_fail() -> None:
    bus = EventBus()

    def boom(ev: Create, state: NodeState) -> None:
        raise ValueError("bad annotation")

    def after(ev: Create, state: NodeState) -> None:
        ev.trace.append("after")

    bus.register_hook(Create, "a-boom", boom)
    bus.register_hook(Create, "b-after", after)
    result = await bus.request(Create(), deadline=1.0, policy="Ignore")
    assert result.errors == {"a-boom": "ValueError: bad annotation"}
    assert result.event.trace == ["after"]
    with pytest.raises(HookError, match="a-boom"):
        await bus.request(Create(), deadline=1.0, policy="Fail")


async def test_duplicate_names_are_refused() -> None:
    bus = EventBus()
    bus.subscribe("x", lambda e, s: None)
    with pytest.raises(ValueError, match="already"):
        bus.subscribe("x", lambda e, s: None)
    bus.register_hook(Create, "h", lambda e, s: None)
    with pytest.raises(ValueError, match="already"):
        bus.register_hook(Create, "h", lambda e, s: None)


async def test_synchronous_hook_past_the_deadline_stops_the_request() -> None:
    """asyncio.timeout cannot interrupt a hook that never awaits: the overrun is still detected."""
    import time

    bus = EventBus()

    def slow(ev: Create, state: NodeState) -> None:
        time.sleep(0.08)  # the hook under test blocks; this is its behaviour, not a wait
        ev.trace.append("slow")

    def after(ev: Create, state: NodeState) -> None:
        ev.trace.append("after")

    bus.register_hook(Create, "a-slow", slow)
    bus.register_hook(Create, "b-after", after)
    result = await bus.request(Create(), deadline=0.02)
    assert result.timed_out
    assert result.event.trace == ["slow"]  # the next hook did not run
    with pytest.raises(TimeoutException, match="a-slow"):
        await bus.request(Create(), deadline=0.02, policy="Fail")
