"""EventBus: publish / subscribe with per-subscriber queues, tick coalescing and no loss of state events.

Delivery contract:
* `publish(event)` reduces the event into NodeState first, then hands `(event, state)` to every subscriber
  of that event type. Each subscriber has its own queue and task, so a slow one never delays another.
  Events whose class sets `coalesce = True` (metric ticks) replace an undelivered one of the same type in
  that subscriber's queue, moving to the tail, so per-subscriber order is kept and ticks never pile up.
  Other events are never dropped: when a queue holds `queue_size` of them, `publish` waits for room
  (`publish_nowait` exceeds the bound instead, and counts it).
* A subscriber may also give an `immediate` handler: a synchronous one that takes the event in the
  publisher's own step when the subscriber has nothing queued and is not busy (so its order is kept),
  and returns False to leave the event to its task after all. It saves the task's wake-up (two loop
  callbacks and a future) for handlers that only note something, such as "a pod changed: pass again".
  An immediate handler must not publish.

Runtime calls that need an answer (NRI, proxy) do not go through the bus: the hook core
(`koordqos.hooks.core`) serves them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from koordqos import observability as obs
from koordqos.events.types import Event
from koordqos.state import NodeState, reduce

log = structlog.get_logger("koordqos.bus")

Handler = Callable[[Any, NodeState], Awaitable[None] | None]
Immediate = Callable[[Any, NodeState], bool]  # True: taken in the publisher's step; False: left to the task


def always(handler: Callable[[Any, NodeState], None]) -> Immediate:
    """The immediate form of a synchronous handler that only takes note: it takes every event."""

    def take(event: Any, state: NodeState) -> bool:
        handler(event, state)
        return True

    return take


_EVENT_COUNTERS: dict[type[Event], Any] = {}
Reducer = Callable[[NodeState, Event], NodeState]


@dataclass(eq=False)
class Subscription:
    """One subscriber: a queue of (event, state) and the task that drains it."""

    name: str
    types: tuple[type[Event], ...]
    handler: Handler
    queue_size: int
    immediate: Immediate | None = None
    queue: deque[tuple[Event, NodeState]] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    handled: int = 0
    failed: int = 0
    busy: bool = False

    def offer(self, event: Event, state: NodeState) -> bool:
        """Enqueue; returns False when a non-coalescing event found the queue full (it is still queued)."""
        if event.coalesce:
            for i, (queued, _) in enumerate(self.queue):
                if type(queued) is type(event):
                    del self.queue[i]
                    obs.BUS_COALESCED.labels(self.name).inc()
                    break
        self.queue.append((event, state))
        self.wakeup.set()
        return event.coalesce or len(self.queue) <= self.queue_size

    def full(self) -> bool:
        """Whether the queue holds `queue_size` events or more."""
        return len(self.queue) >= self.queue_size

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being handled."""
        return not self.queue and not self.busy


class EventBus:
    """Carries events from sources to subscribers."""

    def __init__(
        self,
        state: NodeState | None = None,
        reducer: Reducer = reduce,
        queue_size: int = 1024,
    ) -> None:
        self._state = state if state is not None else NodeState()
        self._reducer = reducer
        self._queue_size = queue_size
        self._subs: list[Subscription] = []
        self._by_type: dict[type[Event], list[Subscription]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False

    @property
    def state(self) -> NodeState:
        """The newest NodeState."""
        return self._state

    @property
    def running(self) -> bool:
        """Whether the subscribers' tasks run (`run` started and not ended)."""
        return self._running

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """All subscriptions, in registration order."""
        return tuple(self._subs)

    def subscribe(
        self,
        name: str,
        handler: Handler,
        *types: type[Event],
        queue_size: int | None = None,
        immediate: Immediate | None = None,
    ) -> Subscription:
        """Deliver events of `types` (and their subclasses) to `handler(event, state)` on its own task, or
        to `immediate(event, state)` in the publisher's step when nothing is queued before the event and
        it returns True (see the module's docstring)."""
        if any(s.name == name for s in self._subs):
            raise ValueError(f"subscriber {name!r} already registered")
        sub = Subscription(name, types or (Event,), handler, queue_size or self._queue_size, immediate)
        sub.room.set()
        self._subs.append(sub)
        self._by_type.clear()
        if self._running:
            self._start(sub)
        return sub

    def _targets(self, etype: type[Event]) -> list[Subscription]:
        subs = self._by_type.get(etype)
        if subs is None:
            subs = [s for s in self._subs if issubclass(etype, s.types)]
            self._by_type[etype] = subs
        return subs

    def _apply(self, event: Event) -> list[Subscription]:
        self._state = self._reducer(self._state, event)
        etype = type(event)
        counter = _EVENT_COUNTERS.get(etype)
        if counter is None:  # labelled child resolved once per type: `labels()` costs more than `inc()`
            counter = _EVENT_COUNTERS[etype] = obs.BUS_EVENTS.labels(etype.__name__)
        counter.inc()
        return self._targets(etype)

    async def publish(self, event: Event) -> None:
        """Reduce `event` into the state and queue it for its subscribers, waiting while a queue is full."""
        state = None
        for sub in self._apply(event):
            state = state or self._state
            if sub.immediate is not None and self._taken_now(sub, event, state):
                continue
            while not event.coalesce and sub.full():
                obs.BUS_BACKPRESSURE.labels(sub.name).inc()
                sub.room.clear()
                await sub.room.wait()
            sub.offer(event, self._state)

    def publish_nowait(self, event: Event) -> None:
        """Like `publish` but never waits: a full queue grows past its bound (counted)."""
        state = None
        for sub in self._apply(event):
            state = state or self._state
            if sub.immediate is not None and self._taken_now(sub, event, state):
                continue
            if not sub.offer(event, state):
                obs.BUS_BACKPRESSURE.labels(sub.name).inc()

    def _taken_now(self, sub: Subscription, event: Event, state: NodeState) -> bool:
        """Whether `sub`'s immediate handler took `event` in this step: only when the bus runs and nothing
        of `sub` is queued or being handled, which keeps the subscriber's order."""
        if not self._running or sub.queue or sub.busy:
            return False
        assert sub.immediate is not None
        try:
            if not sub.immediate(event, state):
                return False
        except Exception as exc:  # the publisher goes on; the failure is the subscriber's
            self._failed(sub, event, exc)
            return True
        sub.handled += 1
        return True

    # -- subscriber tasks -------------------------------------------------------------------------

    async def run(self) -> None:
        """Run every subscriber's task until cancelled."""
        self._running = True
        try:
            for sub in self._subs:
                self._start(sub)
            await asyncio.Event().wait()
        finally:
            self._running = False
            tasks = list(self._tasks.values())
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.clear()

    def _start(self, sub: Subscription) -> None:
        self._tasks[sub.name] = asyncio.get_running_loop().create_task(
            self._drain(sub), name=f"bus:{sub.name}"
        )

    async def _drain(self, sub: Subscription) -> None:
        while True:
            if not sub.queue:
                sub.wakeup.clear()
                await sub.wakeup.wait()
                continue
            event, state = sub.queue.popleft()
            sub.busy = True
            if not sub.full():
                sub.room.set()
            try:
                result = sub.handler(event, state)
                if inspect.isawaitable(result):
                    await result
                sub.handled += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(sub, event, exc)
            finally:
                sub.busy = False

    @staticmethod
    def _failed(sub: Subscription, event: Event, exc: Exception) -> None:
        sub.failed += 1
        obs.SUBSCRIBER_ERRORS.labels(sub.name).inc()
        log.error(
            "subscriber failed",
            subscriber=sub.name,
            event_type=type(event).__name__,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )

    async def drained(self, timeout: float = 5.0) -> None:
        """Wait until every subscriber has handled everything queued so far (for tests and shutdown)."""
        async with asyncio.timeout(timeout):
            while not all(s.idle for s in self._subs):
                await asyncio.sleep(0.001)
