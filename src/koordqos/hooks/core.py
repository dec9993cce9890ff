"""The hook core: how one runtime call (an NRI request, a proxy RPC) runs its hooks.

`run_call` bounds a call by its deadline and applies the failure policy to it; `run_stage` runs the hooks of
one stage on one context; `HookCore` adds what every protocol shares (rules refreshed from NodeState, the pod
cgroup writes before the reply, the reply's decision record). The protocol adapters (`nri/convert.py`,
`proxy/service.py`) only translate messages into contexts and contexts into replies. This module is the one
place that knows the rules:

* hooks run in name order on one context; a hook that raises is logged and counted, then skipped under
  `Ignore`, or fails the call with HookError under `Fail` (before anything is written or replied);
* the deadline is checked after every hook (a synchronous hook cannot be interrupted) and bounds every await
  (`asyncio.timeout`): past it no further hook runs and nothing more is written; under `Ignore` the call
  returns what the completed hooks contributed, under `Fail` it raises TimeoutException. The caller always
  answers its runtime in time;
* a failure of the call's own work (a conversion, a write) counts as a hook failure under the same policy.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.config import FailurePolicy
from koordqos.decisions import DecisionLog
from koordqos.errors import HookError, TimeoutException
from koordqos.hooks.completion import pod_writes
from koordqos.hooks.context import ContainerContext, HookContext, PodContext, Stage
from koordqos.hooks.framework import HookRegistry
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.hooks")

STRATEGY = "runtime-hooks"  # the decision log's strategy name for everything the runtime hooks do
REPLY_TARGETS_LOGGED = 4096  # targets whose last logged reply decision is remembered; then forgotten at once
_bookkeeping_failed: SeenOnce[tuple[str, str]] = SeenOnce(64)  # (work, error type) logged once

HOOK_SECONDS = obs.LoopHistogram(
    "koordqos_runtime_hook_seconds",
    "Duration of one runtime hook at one stage",
    ["hook", "stage"],
    buckets=(0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.001, 0.01),
)
HOOK_FAILURES = Counter(
    "koordqos_runtime_hook_failures_total",
    "Runtime hooks that raised, by hook and stage",
    ["hook", "stage"],
    registry=obs.REGISTRY,
)


def call_deadline(request_timeout: float, elapsed: float, timeout_nano: int = 0) -> float:
    """Seconds a call's hooks may run: the caller's timeout minus a safety margin (20 %, at least 100 ms,
    at most 500 ms) and minus the time already spent; never below 1 ms."""
    budget = request_timeout
    if timeout_nano > 0:
        budget = min(budget, timeout_nano / 1e9)
    margin = min(0.5, max(0.1, 0.2 * budget))
    return max(0.001, budget - margin - elapsed)


@dataclass(slots=True, eq=False, init=False)  # `__init__` declared: see `hooks.resources.Resources`
class Call:
    """One runtime call in progress: its name (a metric label), policy, deadline, and what ran."""

    name: str
    policy: FailurePolicy
    deadline: float  # seconds
    end: float  # time.perf_counter() value past which nothing more runs
    ran: list[str]
    errors: dict[str, str]
    timed_out: bool
    step: str  # the hook (or step) running now: named when the deadline passes
    # The call's bookkeeping, done when it settles (`settle`): the hooks' durations, its own (-1 until it
    # ended), and deferred work such as a decision record (`defer`). None of it is the reply, so the NRI
    # plugin settles a call after its reply is written: a reply a few µs sooner keeps a Go runtime from
    # parking its thread, which then costs it a wake-up of 25 µs or more (docs/performance.md, session 31).
    hook_times: list[tuple[str, Stage, float]]
    took: float
    later: list[tuple[Callable[..., object], tuple[Any, ...]]]
    # The rest of the call when its body has to wait (`start_call`): a coroutine the caller awaits on a task,
    # which ends the call; None when the call ran to its end where it was started. Dropped once it ran, so the
    # call and its coroutine do not keep each other.
    rest: Coroutine[Any, Any, None] | None

    def __init__(
        self,
        name: str,
        policy: FailurePolicy,
        deadline: float,
        end: float,
        ran: list[str] | None = None,
        errors: dict[str, str] | None = None,
        timed_out: bool = False,
        step: str = "",
    ) -> None:
        self.name = name
        self.policy = policy
        self.deadline = deadline
        self.end = end
        self.ran = [] if ran is None else ran
        self.errors = {} if errors is None else errors
        self.timed_out = timed_out
        self.step = step
        self.hook_times = []
        self.took = -1.0
        self.later = []
        self.rest = None

    @classmethod
    def start(cls, name: str, deadline: float, policy: FailurePolicy = "Ignore") -> Call:
        """A call whose deadline starts now."""
        return cls(name, policy, deadline, time.perf_counter() + deadline)

    def overran(self) -> None:
        """The deadline passed during `step`: logged and counted; raises TimeoutException under Fail."""
        step = self.step or self.name
        self.timed_out = True
        obs.HOOK_ERRORS.labels(step, "timeout").inc()
        log.warning(
            "hook overran the request deadline",
            hook=step,
            request=self.name,
            deadline_ms=round(self.deadline * 1000, 1),
            policy=self.policy,
        )
        if self.policy == "Fail":
            raise TimeoutException(f"hook {step} overran the {self.deadline * 1000:.0f} ms deadline")

    def ended(self) -> None:
        """The call's work is done: its duration is taken now (observed when it settles)."""
        self.took = time.perf_counter() - (self.end - self.deadline)

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(*args)` when the call settles: bookkeeping, not part of the reply."""
        self.later.append((fn, args))

    def settle(self) -> None:
        """Observe the hooks' and the call's durations and run the deferred work; a second call does nothing.
        A failing piece of deferred work is counted (`koordqos_errors_total`), logged once per kind, and the
        rest still runs."""
        times = self.hook_times
        if times:
            self.hook_times = []
            for name, stage, seconds in times:
                timer = _TIMERS.get((name, stage))  # inline: a call per hook costs more than the lookup
                (timer or _timer(name, stage)).observe(seconds)
        if self.took >= 0:
            _call_timer(self.name).observe(self.took)
            self.took = -1.0
        later = self.later
        if later:
            self.later = []
            for fn, args in later:
                try:
                    fn(*args)
                except Exception as exc:
                    kind = type(exc).__name__
                    obs.ERRORS.labels("runtime-call-bookkeeping", kind).inc()
                    if _bookkeeping_failed.first((getattr(fn, "__qualname__", repr(fn)), kind)):
                        log.error(
                            "runtime call bookkeeping failed",
                            request=self.name,
                            error=f"{kind}: {exc}",
                            exc_info=exc,
                        )

    def failed(self, step: str, exc: Exception) -> None:
        """`step` raised: logged and counted; raises HookError under Fail."""
        msg = f"{type(exc).__name__}: {exc}"
        self.errors[step] = msg
        obs.HOOK_ERRORS.labels(step, "error").inc()
        log.warning("runtime hook failed", hook=step, request=self.name, error=msg, policy=self.policy)
        if self.policy == "Fail":
            raise HookError(f"hook {step} failed: {exc}") from exc


def target_of(ctx: HookContext) -> str:
    """Human-readable target of a context, for logs and decisions."""
    if isinstance(ctx, ContainerContext):
        r = ctx.request
        what = "sandbox" if r.sandbox else r.container_name
        return f"{r.pod_namespace}/{r.pod_name}/{what}"
    return f"{ctx.request.namespace}/{ctx.request.name}"


_TIMERS: dict[tuple[str, Stage], obs.LoopHistogramChild] = {}
_CALL_TIMERS: dict[str, obs.LoopHistogramChild] = {}


def _timer(name: str, stage: Stage) -> obs.LoopHistogramChild:
    # labelled children resolved once: `labels()` costs more than the observation itself
    t = _TIMERS.get((name, stage))
    if t is None:
        t = _TIMERS[(name, stage)] = HOOK_SECONDS.labels(name, stage.value)
    return t


def _call_timer(name: str) -> obs.LoopHistogramChild:
    t = _CALL_TIMERS.get(name)
    if t is None:
        t = _CALL_TIMERS[name] = obs.REQUEST_SECONDS.labels(name)
    return t


def run_stage(registry: HookRegistry, call: Call, stage: Stage, ctx: HookContext) -> None:
    """Run the stage's hooks on `ctx` in name order within the call's deadline and policy."""
    if call.timed_out:
        return  # past the deadline (Ignore): nothing more runs
    clock = time.perf_counter
    ran = call.ran
    times = call.hook_times
    end = call.end
    now = clock()
    for hook in registry.hooks(stage):
        call.step = hook.name
        start = now
        try:
            hook.fn(ctx)
            ran.append(hook.name)
        except Exception as exc:
            HOOK_FAILURES.labels(hook.name, stage.value).inc()
            msg = f"{type(exc).__name__}: {exc}"
            call.errors[hook.name] = msg
            log.warning(
                "runtime hook failed",
                hook=hook.name,
                stage=stage.value,
                target=target_of(ctx),
                error=msg,
                policy=call.policy,
            )
            if call.policy == "Fail":
                raise HookError(f"hook {hook.name} failed at {stage}: {exc}") from exc
        finally:
            # one clock reading ends this hook and starts the next; observed when the call settles
            now = clock()
            times.append((hook.name, stage, now - start))
        if now > end:
            call.overran()  # raises under Fail
            return


Body = Callable[[Call], Awaitable[None] | None]


def start_call(name: str, deadline: float, policy: FailurePolicy, body: Body, settle: bool = True) -> Call:
    """Run `body` (one call's conversion, stages and reply) within `deadline` s under `policy`, without a
    task when it can, and return its Call. A synchronous body runs to the end here; a body that returns an
    awaitable (an async handler, not started yet) leaves the rest of the call in `Call.rest`, a coroutine
    that the caller awaits on a task, which runs it under `asyncio.timeout` for the rest of the deadline.

    Under Fail a hook failure raises HookError and an overrun raises TimeoutException (from here, or from
    awaiting `rest`); under Ignore the call returns with `timed_out` / `errors` set and whatever the
    completed work put into its contexts.

    The call settles (`Call.settle`: its timings observed, its deferred work run) before it is returned, or
    with `settle=False` a call that ran to its end here is left for the caller to settle once it has
    replied (a call that raises, or goes on in `rest`, settles before that in any case).
    """
    call = Call.start(name, deadline, policy)
    try:
        out = body(call)
    except Exception as exc:
        try:
            _body_failed(call, name, exc)
        finally:
            call.ended()
            call.settle()
        return call
    if out is not None and inspect.isawaitable(out):
        call.rest = _finish_call(call, name, out)
        return call
    try:
        if not call.timed_out and time.perf_counter() > call.end:
            call.overran()
    except TimeoutException:
        call.ended()
        call.settle()  # the caller gets no Call to settle
        raise
    call.ended()
    if settle:
        call.settle()
    return call


def _body_failed(call: Call, name: str, exc: Exception) -> None:
    if isinstance(exc, HookError | TimeoutException):
        raise exc
    call.failed(call.step or name, exc)


async def _finish_call(call: Call, name: str, pending: Awaitable[None]) -> None:
    try:
        async with asyncio.timeout(max(0.0, call.end - time.perf_counter())):
            await pending
        if not call.timed_out and time.perf_counter() > call.end:
            call.overran()
    except TimeoutError:  # asyncio.timeout fired at an await
        call.overran()
    except Exception as exc:
        _body_failed(call, name, exc)
    finally:
        call.rest = None
        call.ended()
        call.settle()


async def run_call(name: str, deadline: float, policy: FailurePolicy, body: Body) -> Call:
    """`start_call` for callers on a task: the body runs within `deadline` s under `policy`, to its end."""
    call = start_call(name, deadline, policy, body)
    rest = call.rest
    if rest is not None:
        await rest
    return call


class HookCore:
    """What every protocol adapter shares: the enabled hooks, rules from NodeState, pod writes, decisions."""

    def __init__(
        self, hooks: RuntimeHooks, executor: CgroupExecutor | None, decisions: DecisionLog | None = None
    ) -> None:
        self.hooks = hooks
        self.executor = executor
        self.decisions = decisions if decisions is not None else DecisionLog()
        # target → the (action, old, new, dry-run) of the reply decision last logged for it: the same decision
        # again (a reconnect's Synchronize, a repeated UpdateContainer) is recorded and counted, not logged
        self._reply_logged: dict[str, tuple[str, object, object, bool]] = {}

    @property
    def dry_run(self) -> bool:
        """Replies change nothing: the runtime gets its request back, a decision records the rest."""
        return self.decisions.dry_run

    def stage(self, call: Call, stage: Stage, ctx: HookContext, state: NodeState) -> None:
        """Refresh the rules from `state`, then run the stage's hooks on `ctx`."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        run_stage(self.hooks.registry, call, stage, ctx)

    async def pod_stage(
        self, call: Call, stage: Stage, ctx: PodContext, state: NodeState, reason: str
    ) -> None:
        """Run a pod stage, then write the pod-level values to the pod cgroup before the caller replies
        (koordlet's injectForExt: a pod-stage reply cannot carry them)."""
        self.stage(call, stage, ctx, state)
        writes = pod_writes(ctx)
        if writes and self.executor is not None and not call.timed_out:
            call.step = "pod cgroup writes"
            await self.executor.apply(STRATEGY, writes, reason=reason)

    def refresh(self, state: NodeState) -> None:
        """Rules and the share pools from `state` (`RuntimeHooks.refresh`), before a call that plans many
        containers from one state (Synchronize): what the reconciler computes from the same state."""
        self.hooks.refresh(state)

    def record_reply(
        self,
        target: str,
        action: str,
        new: str,
        reason: str,
        dry: bool | None = None,
        old: str | None = None,
    ) -> bool:
        """Record what a reply changes (`old`: the container's values before it), logged at info like every
        decision unless it repeats the one last logged for `target`; False in dry-run (the runtime then gets
        nothing). `dry`: dry-run as read when the reply was made (a record made later).

        In dry-run a repeat is not recorded at all: the runtime kept the container's values because nothing
        was sent, where after a real run's reply it would hold the new ones and the call would be no decision
        (a reconnect's Synchronize); so a dry-run records what a real run records, once."""
        dry = self.decisions.dry_run if dry is None else dry
        logged = self._reply_logged
        key = (action, old, new, dry)
        repeated = logged.get(target) == key
        if repeated and dry:
            return False
        if not repeated:
            if len(logged) >= REPLY_TARGETS_LOGGED and target not in logged:
                logged.clear()  # bounded: targets are the runtime's names, of any number
            logged[target] = key
        self.decisions.record(STRATEGY, target, action, old, new, reason, dry_run=dry, quiet=repeated)
        return not dry

    def forget_pod(self, pod_dir: str) -> None:
        """A pod is gone: drop the executor's cached values for its cgroups."""
        if pod_dir and self.executor is not None:
            self.executor.invalidate(pod_dir)
