"""Reconciler: keep pod, container and kube-QoS settings true (docs/behaviour-runtime-hooks.md, "Reconciler").

Runs every `hooks.reconcile_interval_seconds` and soon after pod, Node or NodeSLO changes (changes are
coalesced: one pass covers all that arrived meanwhile). The passes the loop runs are incremental — only the
pods whose inputs changed are planned again, plus those whose writes did not all land — and full at start,
after a rule/Node/NodeSLO change and every `full_interval` seconds — by default the executor's cache period
(`executor.resource_force_update_seconds`, 60 s) or the reconcile interval if longer: a file changed behind
the agent's back was never corrected sooner than the cache let the rewrite through, so drift is corrected as
before. A direct `reconcile()` call is full. The interval passes still apply the per-process targets of every
pod (processes started since in unchanged containers). A pass is computed by `ReconcilePlanner`
(`reconcile_plan.py`) and carried out by the actuators: cgroup writes through the CgroupExecutor as one
leveled, cacheable batch (unchanged values are not rewritten; settings missed while the agent or the runtime
was down converge), and sysctl, oom_score_adj and core-sched cookies through the HostActuator, off the loop.

NodeSLO host applications (docs/behaviour-runtime-hooks.md, "Host applications") are reconciled in the same
pass: bvt and cpuset at the app's cgroup dir. Since rules are re-parsed at the start of every pass, a
GroupIdentity or CPUSetAllocator rule change rewrites the host apps in the pass that sees it (the rule
callbacks' host-app step).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog
from prometheus_client import Counter, Histogram

from koordqos import observability as obs
from koordqos.bus import EventBus, always
from koordqos.cgroups.executor import CgroupExecutor, WriteResult
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.reader import read_procs
from koordqos.decisions import DecisionLog
from koordqos.events.types import (
    Event,
    NodeSLOUpdated,
    NodeUpdated,
    PodsReplaced,
    PodUpserted,
    RuntimeContainerUpserted,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
    SourceSynced,
)
from koordqos.hooks.host_intents import cookie_intents, group_identity_sysctls, oom_intents
from koordqos.hooks.reconcile_plan import CLUSTER_POD_SOURCES, MAX_WARNED, PassResult, ReconcilePlanner
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.host import CoreSchedPrune, HostActuator, HostIntent
from koordqos.once import SeenOnce
from koordqos.outcome import Outcome
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.hooks.reconciler")

STRATEGY = "runtime-hooks"
YIELD_EVERY_PODS = 20
YIELD_AFTER_SECONDS = 0.002
# Write outcomes after which a pod counts as applied; any other (dir vanished, write failed) plans it again.
SETTLED = frozenset(
    {Outcome.WRITTEN, Outcome.DRY_RUN, Outcome.UNCHANGED, Outcome.CACHED, Outcome.UNSUPPORTED}
)

RECONCILE_PASSES = Counter(
    "koordqos_hooks_reconcile_passes_total",
    "Reconciler passes by trigger",
    ["trigger"],
    registry=obs.REGISTRY,
)
RECONCILE_PLANNED = Counter(
    "koordqos_hooks_reconcile_planned_pods_total",
    "Pods planned by reconciler passes, by kind (an incremental pass plans only pods whose inputs changed)",
    ["pass"],
    registry=obs.REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "koordqos_hooks_reconcile_seconds",
    "Duration of one reconciler pass (compute + apply)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    registry=obs.REGISTRY,
)

TRIGGERS: tuple[type[Event], ...] = (
    PodUpserted,
    PodsReplaced,
    NodeUpdated,
    NodeSLOUpdated,
    RuntimeSandboxUpserted,
    RuntimeContainerUpserted,
    RuntimeSynchronized,
    SourceSynced,  # the pods are all known now: the dangling-pod-dir step may run (reconcile_plan.py)
)
#: Triggers of the passes the loop may run incrementally; any other (start, manual) asks for a full pass.
INCREMENTAL_TRIGGERS = frozenset({"interval", *(t.__name__ for t in TRIGGERS)})


class HookReconciler:
    """Plans passes and hands them to the actuators; a Component when run with a bus."""

    name = "hooks-reconciler"
    essential = False

    def __init__(
        self,
        hooks: RuntimeHooks,
        layout: CgroupLayout,
        executor: CgroupExecutor,
        host: HostActuator,
        decisions: DecisionLog,
        *,
        bus: EventBus | None = None,
        interval: float = 10.0,
        settle: float = 0.5,
        full_interval: float | None = None,
        pod_sources: frozenset[str] = CLUSTER_POD_SOURCES,
    ) -> None:
        self.hooks = hooks
        self.layout = layout
        self.executor = executor
        self.host = host
        self.decisions = decisions
        self.bus = bus
        self.interval = interval
        self.settle = settle
        # the executor skips a value it wrote within force_update_seconds anyway: a full pass more often
        # than that would re-plan what the executor then skips
        self.full_interval = (
            max(interval, executor.force_update_seconds) if full_interval is None else full_interval
        )
        self._last_full = float("-inf")  # time.monotonic() of the last full pass
        self.planner = ReconcilePlanner(hooks, layout, pod_sources)
        self._wake = asyncio.Event()
        self._trigger = "start"
        self.passes = 0
        self.last: PassResult | None = None
        self._pass_errors_logged: SeenOnce[str] = SeenOnce(MAX_WARNED)  # pass failure texts logged
        if bus is not None:
            bus.subscribe(self.name, self._on_event, *TRIGGERS, immediate=always(self._on_event))

    # -- component --------------------------------------------------------------------------------

    def _on_event(self, event: Event, state: NodeState) -> None:
        self._trigger = type(event).__name__
        self._wake.set()

    async def run(self) -> None:
        """Pass at start, then every interval and after changes."""
        assert self.bus is not None
        while True:
            trigger = self._trigger
            self._wake.clear()
            try:
                await self.reconcile(self.bus.state, trigger)
            except Exception as exc:  # one bad pass must not stop the loop
                self._pass_failed(exc)
            self._trigger = "interval"
            # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a cancellation that races a wakeup
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            else:
                # woken by a change: let a burst of changes (a Synchronize, a re-list, a batch of container
                # creations) settle into one pass instead of one full pass per event
                await asyncio.sleep(min(self.settle, self.interval))

    def _pass_failed(self, exc: Exception) -> None:
        """Count every failed pass; log (with traceback) each distinct error text once."""
        obs.ERRORS.labels("hooks-reconciler", "pass").inc()
        text = f"{type(exc).__name__}: {exc}"
        if self._pass_errors_logged.first(text):
            log.error("reconcile pass failed", error=text, exc_info=exc)

    # -- one pass ---------------------------------------------------------------------------------

    async def reconcile(
        self, state: NodeState, trigger: str = "manual", *, full: bool | None = None
    ) -> PassResult:
        """Compute the intents from `state` and hand them to the actuators.

        Full unless the trigger is an event or the interval and a full pass ran within `full_interval` (or
        `full` says otherwise).
        """
        start = time.perf_counter()
        if full is None:
            full = (
                trigger not in INCREMENTAL_TRIGGERS
                or time.monotonic() - self._last_full >= self.full_interval
            )
        result = PassResult()
        try:
            await self._plan_and_apply(state, trigger, result, full)
        except BaseException:  # failed or cancelled half-way: what was planned may not have landed
            self.planner.forget_all()
            raise
        self.passes += 1
        self.last = result
        RECONCILE_SECONDS.observe(time.perf_counter() - start)
        return result

    async def _plan_and_apply(self, state: NodeState, trigger: str, result: PassResult, full: bool) -> None:
        steps = self.planner.steps(state, result, full=full, all_processes=full or trigger == "interval")
        clock = time.perf_counter
        since = clock()
        for done, _ in enumerate(steps, 1):
            # keep every step on the loop short at hundreds of pods: a turn for the others every 20 pods,
            # or sooner when they took long (a pod with many containers, a slow machine)
            if done % YIELD_EVERY_PODS == 0 or clock() - since >= YIELD_AFTER_SECONDS:
                await asyncio.sleep(0)
                since = clock()
        # a turn before the hand-over: the executor paces its own work from its start, so the end of the
        # planning (the pass's tail after the last pod) and its first writes are not one step
        await asyncio.sleep(0)
        if result.full:
            self._last_full = time.monotonic()
        RECONCILE_PASSES.labels(trigger).inc()
        RECONCILE_PLANNED.labels("full" if result.full else "incremental").inc(len(result.planned))
        if "GroupIdentity" in result.rules_updated:
            # before the bvt writes: the sysctl turns group identity on
            await self.host.apply(STRATEGY, group_identity_sysctls(self.hooks.group_identity))
        if result.writes:
            outcomes = await self.executor.apply(STRATEGY, result.writes, reason=f"reconcile ({trigger})")
            self._forget_unsettled(result, outcomes)
        await self.host.apply(STRATEGY, await self._per_process_intents(result))

    def _forget_unsettled(self, result: PassResult, outcomes: Sequence[WriteResult]) -> None:
        """Pods with a write that did not land are planned again next pass (as every pass did before)."""
        if len(outcomes) != len(result.writes):  # one result per intent, in order; else trust none
            for uid in result.planned:
                self.planner.forget(uid)
            return
        for uid, (lo, hi) in result.spans.items():
            if any(outcomes[i].outcome not in SETTLED for i in range(lo, hi)):
                self.planner.forget(uid)

    def compute(self, state: NodeState) -> PassResult:
        """The intents of one pass (pure apart from listing dangling pod dirs after a bvt rule change)."""
        result = PassResult()
        for _ in self.planner.steps(state, result):
            pass
        return result

    async def _per_process_intents(self, result: PassResult) -> list[HostIntent]:
        """oom_score_adj and cookie intents for the processes now in the target containers."""
        intents: list[HostIntent] = []
        if self.hooks.core_sched is not None and self.host.cookies is not None:
            # also with no targets: containers that went away must leave the cookie caches
            intents.append(CoreSchedPrune(frozenset(result.containers)))
        cookies = result.cookies if self.host.cookies is not None else []
        dirs = {t.cgroup_dir for t in result.oom} | {t.cgroup_dir for t in cookies}
        if dirs:
            pids = await asyncio.to_thread(self._read_procs, sorted(dirs))
            intents += oom_intents(result.oom, pids)
            intents += cookie_intents(cookies, pids)
        return intents

    def _read_procs(self, dirs: Sequence[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for d in dirs:
            procs = read_procs(self.layout, d)
            if procs is not None:
                out[d] = procs
        return out


__all__ = ["STRATEGY", "HookReconciler", "PassResult"]
