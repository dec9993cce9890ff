"""GcPolicy: the agent process's garbage-collector policy (freeze what is live, pace older generations)."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Protocol

import structlog

from koordqos.errors import ConfigError

log = structlog.get_logger("koordqos.agent")


class _Passes(Protocol):
    @property
    def passes(self) -> int: ...


class _Parts(Protocol):
    @property
    def reconciler(self) -> _Passes | None: ...
    @property
    def nri(self) -> object | None: ...


class _State(Protocol):
    @property
    def nri_connected(self) -> bool: ...


class _Bus(Protocol):
    @property
    def state(self) -> _State: ...


class SettlingAgent(Protocol):
    """What the policy reads of the agent to know start-up settled (`koordqos.agent.Agent` is one)."""

    @property
    def ready(self) -> bool: ...
    @property
    def parts(self) -> _Parts: ...
    @property
    def bus(self) -> _Bus: ...


class GcPolicy:
    """Keeps garbage collections out of the event loop's steps and full collections short at any pod count.

    A full (generation-2) collection walks every object the collector tracks that is not frozen: at 1,000
    pods the pods, the runtime containers, the metric series' keys, the report history... ≈ 30 ms in one
    loop step every 20–60 s. The live set hardly changes from one minute to the next, so walking it again
    finds nothing; what must be walked is what became long-lived since. And a young collection (≈ 0.5 ms
    for generation 0, ≈ 2.5 ms for generation 1 at 1,000 pods, mostly the last metrics round) runs wherever
    an allocation crosses a threshold, i.e. inside some other step, which it lengthens. So:

    * once start-up has settled (ready, the NRI runtime synchronized, a reconciler pass done after that) the
      objects are frozen (`gc.freeze()`: moved to the permanent generation, O(1), no collection);
    * after every full collection its survivors are frozen too: the next one walks only what became
      long-lived since (its cost follows the churn, not the pod count);
    * `paced` (the default): the interpreter still collects generation 0 itself (≈ 0.3 ms, wherever an
      allocation crosses its threshold), but generations 1 and 2 only when a task, every PACE_SECONDS,
      finds them due (GEN1_AFTER, GEN2_AFTER): those collections are loop steps of their own,
      never inside another. (Pacing generation 0 too made it larger: ~700 objects become thousands
      between two looks.)

    What it costs: a frozen object that later becomes part of an unreachable *cycle* is not collected
    (acyclic garbage is freed by reference counting as ever); docs/performance.md measures how much that is.
    Code on long-running paths therefore leaves no such cycles (`koordqos.testing.cycles`,
    `errors.detached`). No automatic thaw: `gc.get_freeze_count()` walks the frozen set (≈ 20 ms at 1,000
    pods) and a full collection after `gc.unfreeze()` is a 20-40 ms step (docs/performance.md).
    `KOORDQOS_GC_POLICY=build` keeps only the freeze after the build (the behaviour before), `settle` the
    freezes without the pacing. Only the agent process runs it (`run`), not agents built in tests.
    """

    name = "gc-policy"
    essential = False
    ENV = "KOORDQOS_GC_POLICY"
    AUDIT_ENV = "KOORDQOS_GC_AUDIT"
    MODES = ("build", "settle", "paced")
    # how often the task looks (a loop wake-up costs ~0.2 ms of CPU on the development VM: every 20 ms that
    # would be 1 % of a core; collections of generation 1 are due every second or more)
    PACE_SECONDS = 0.1
    # Lower than the interpreter's 10 and 10: a generation-1 collection walks the young objects still alive
    # (under container churn those of the last seconds) and a frozen-pruned full one what became long-lived
    # since the last: more often, each is shorter (at 1,000 pods with churn: generation 1 up to ≈ 5 ms and
    # full ones 4–7 ms with 10 and 10; figures in docs/performance.md).
    GEN1_AFTER = 5
    GEN2_AFTER = 2
    NEVER = 1 << 30  # a count the interpreter's own generation-1 and -2 triggers never reach

    def __init__(
        self, agent: SettlingAgent, mode: str | None = None, poll: float = 1.0, give_up: float = 300.0
    ) -> None:
        self.agent = agent
        self.mode = mode or os.environ.get(self.ENV, "paced")
        if self.mode not in self.MODES:
            raise ConfigError(f"{self.ENV}={self.mode!r}: one of {', '.join(self.MODES)}")
        self.poll = poll
        self.give_up = give_up
        self.freezes = 0
        self.polls = 0  # looks at whether start-up settled
        self.collections = [0, 0, 0]  # paced collections by generation

    def _after_full(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            gc.freeze()  # the survivors of a full collection: live, and walked just now
            self.freezes += 1

    def _settled(self, passes_at_ready: int | None) -> bool:
        rec = self.agent.parts.reconciler
        return passes_at_ready is not None and (rec is None or rec.passes > passes_at_ready)

    async def _settle(self) -> None:
        """Until start-up settled: ready, the runtime synchronized, a reconciler pass done after that."""
        agent = self.agent
        nri = agent.parts.nri is not None
        deadline = time.monotonic() + self.give_up
        passes_at_ready: int | None = None
        while time.monotonic() < deadline and not self._settled(passes_at_ready):
            await asyncio.sleep(self.poll)
            self.polls += 1
            if passes_at_ready is None and agent.ready and (not nri or agent.bus.state.nri_connected):
                rec = agent.parts.reconciler
                passes_at_ready = rec.passes if rec is not None else 0

    def collect_due(self) -> int | None:
        """The older generation (1 or 2) due: generation 1 after more than GEN1_AFTER generation-0
        collections, generation 2 after more than GEN2_AFTER generation-1 ones (the interpreter's defaults
        are 10 and 10, and a 25 % growth of the long-lived objects for 2)."""
        _, c1, c2 = gc.get_count()
        if c1 <= self.GEN1_AFTER:
            return None
        return 2 if c2 > self.GEN2_AFTER else 1

    async def run(self) -> None:
        """Freeze once start-up settled, then after every full collection; pace collections."""
        if self.mode == "build":
            await asyncio.Event().wait()
        gc.callbacks.append(self._after_full)
        thresholds = gc.get_threshold()
        try:
            await self._settle()
            gc.freeze()
            self.freezes += 1
            if self.mode == "settle":
                await asyncio.Event().wait()
            # the interpreter's generation-1 and -2 triggers out of reach: this task pulls them instead
            gc.set_threshold(thresholds[0], self.NEVER, self.NEVER)
            while True:
                await asyncio.sleep(self.PACE_SECONDS)
                gen = self.collect_due()
                if gen is not None:
                    gc.collect(gen)
                    self.collections[gen] += 1
        finally:
            gc.set_threshold(*thresholds)
            gc.callbacks.remove(self._after_full)
            if os.environ.get(self.AUDIT_ENV):
                self._audit()

    def _audit(self) -> None:
        """`KOORDQOS_GC_AUDIT=1`: at exit, log how much garbage the freezes kept from the collector (a full
        collection after `gc.unfreeze()`, once the ordinary garbage is gone). A measurement, not for use."""
        frozen = gc.get_freeze_count()
        gc.collect()
        gc.unfreeze()
        start = time.perf_counter()
        kept = gc.collect()
        log.warning(
            "gc audit",
            mode=self.mode,
            freezes=self.freezes,
            frozen=frozen,
            garbage_kept_by_freezing=kept,
            full_collection_ms=round((time.perf_counter() - start) * 1000, 1),
            paced_collections=self.collections,
        )
