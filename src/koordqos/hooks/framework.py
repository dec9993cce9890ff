"""Hook registry and runner: hooks by stage, sorted by name, run sequentially under a failure policy.

koordlet semantics (runtime-hooks.md §1.3): a stage's hooks run in name order (code-point order, so
upper-case names first) on one shared context, so on a shared response field the last writer wins.
Under `Fail` the first error stops the stage; under `Ignore` errors are logged and counted and the run
continues. Independent of NRI: the proxy hook service and the reconciler use the same runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from prometheus_client import Counter, Histogram

from koordqos import observability as obs
from koordqos.errors import ConfigError, HookError
from koordqos.hooks.context import STAGES, ContainerContext, HookContext, PodContext, Stage

log = structlog.get_logger("koordqos.hooks")

FailurePolicy = Literal["Ignore", "Fail"]
HookFn = Callable[[Any], None]

HOOK_SECONDS = Histogram(
    "koordqos_runtime_hook_seconds",
    "Duration of one runtime hook at one stage",
    ["hook", "stage"],
    buckets=(0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.001, 0.01),
    registry=obs.REGISTRY,
)
HOOK_FAILURES = Counter(
    "koordqos_runtime_hook_failures_total",
    "Runtime hooks that raised, by hook and stage",
    ["hook", "stage"],
    registry=obs.REGISTRY,
)


def parse_failure_policy(text: str) -> FailurePolicy:
    """koordlet GetFailurePolicyType: exactly `Fail` or `Ignore`."""
    if text == "Fail":
        return "Fail"
    if text == "Ignore":
        return "Ignore"
    raise ConfigError(f"runtime hooks failure policy {text!r}: expected Fail or Ignore")


@dataclass(frozen=True, slots=True)
class RegisteredHook:
    """One hook at one stage."""

    name: str
    description: str
    fn: HookFn


@dataclass
class HookRegistry:
    """Hooks by stage; registration order does not matter, execution is by name."""

    _by_stage: dict[Stage, list[RegisteredHook]] = field(default_factory=lambda: {s: [] for s in STAGES})

    def register(self, stage: Stage, name: str, description: str, fn: HookFn) -> None:
        """Add a hook; a duplicate name in a stage is a programming error."""
        hooks = self._by_stage[stage]
        if any(h.name == name for h in hooks):
            raise ValueError(f"hook {name!r} already registered at stage {stage}")
        hooks.append(RegisteredHook(name, description, fn))
        hooks.sort(key=lambda h: h.name)

    def hooks(self, stage: Stage) -> Sequence[RegisteredHook]:
        """Hooks of `stage` in execution order."""
        return tuple(self._by_stage[stage])

    def stages(self, disabled: frozenset[Stage] = frozenset()) -> list[Stage]:
        """Stages with at least one hook, not disabled, in the fixed stage order (deterministic)."""
        return [s for s in STAGES if self._by_stage[s] and s not in disabled]


@dataclass
class StageResult:
    """What one stage run did."""

    ran: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def target_of(ctx: HookContext) -> str:
    """Human-readable target of a context, for logs and decisions."""
    if isinstance(ctx, ContainerContext):
        r = ctx.request
        what = "sandbox" if r.sandbox else r.container_name
        return f"{r.pod_namespace}/{r.pod_name}/{what}"
    assert isinstance(ctx, PodContext)
    return f"{ctx.request.namespace}/{ctx.request.name}"


_TIMERS: dict[tuple[str, Stage], Any] = {}


def _timer(name: str, stage: Stage) -> Any:
    # labelled children resolved once: `labels()` costs more than the observation itself
    t = _TIMERS.get((name, stage))
    if t is None:
        t = _TIMERS[(name, stage)] = HOOK_SECONDS.labels(name, stage.value)
    return t


def run_hooks(registry: HookRegistry, policy: FailurePolicy, stage: Stage, ctx: HookContext) -> StageResult:
    """Run the stage's hooks on `ctx` in name order; under Fail raise HookError on the first error."""
    result = StageResult()
    for hook in registry.hooks(stage):
        timer = _timer(hook.name, stage)
        start = time.perf_counter()
        try:
            hook.fn(ctx)
            result.ran.append(hook.name)
        except Exception as exc:
            HOOK_FAILURES.labels(hook.name, stage.value).inc()
            msg = f"{type(exc).__name__}: {exc}"
            result.errors[hook.name] = msg
            log.warning(
                "runtime hook failed",
                hook=hook.name,
                stage=stage.value,
                target=target_of(ctx),
                error=msg,
                policy=policy,
            )
            if policy == "Fail":
                raise HookError(f"hook {hook.name} failed at {stage}: {exc}") from exc
        finally:
            timer.observe(time.perf_counter() - start)
    return result
