"""What a hook plugin declares, and the stage table the core runs.

A hook is one module: its plugin class (a `HookPlugin`) says which function runs at which stage
(`stage_hooks`), which reconcile functions keep its settings true at which level and for which pod QoS
(`reconcilers`), and how NodeSLO / Node changes update its rule (`update_slo`, `update_node`); the module
ends with `HOOK = HookSpec(name, gate, build)`. `hooks/registry.py` lists the modules, one line each.

koordlet semantics (docs/behaviour-runtime-hooks.md, "Stages and hook order"): a stage's hooks run in name
order (code-point order, so upper-case names first) on one shared context, so on a shared response field the
last writer wins.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from koordqos.hooks.context import STAGES, Stage
from koordqos.hooks.options import HookOptions
from koordqos.hooks.rules import NodeRules, SLOView

HookFn = Callable[[Any], None]


class Level(enum.StrEnum):
    """Where a reconcile function runs (docs/behaviour-runtime-hooks.md, "Reconciler", "Host
    applications")."""

    POD = "pod"
    CONTAINER = "container"
    SANDBOX = "sandbox"
    KUBE_QOS = "kubeqos"
    HOST_APP = "hostapp"


# pod-QoS conditions of koordlet's reconcilers (PodQOSFilter values; "" is a pod without the label)
BE = frozenset({"BE"})
PINNED = frozenset({"LSE", "LSR"})
SHARE = frozenset({"LS", ""})
UNPINNED = frozenset({"LS", "BE", "SYSTEM", ""})


@dataclass(frozen=True, slots=True)
class Reconciler:
    """One reconcile function at one level, with the pod-QoS conditions it runs under (None: every pod)."""

    level: Level
    resource: str
    fn: HookFn
    conditions: frozenset[str] | None = None
    plugin: str = ""

    def applies(self, condition: str) -> bool:
        """Whether this reconciler runs for a pod with `condition`."""
        return self.conditions is None or condition in self.conditions


class HookPlugin:
    """Base of the hook plugins: by default no stage hooks, no reconcilers and no rule."""

    name: str = ""

    def stage_hooks(self) -> Mapping[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {}

    def reconcilers(self) -> Sequence[Reconciler]:
        """The reconcile functions, in the order they run at each level."""
        return ()

    def update_slo(self, view: SLOView) -> bool:
        """A new NodeSLO is in force; True when the plugin's rule changed."""
        return False

    def update_node(self, node: NodeRules) -> bool:
        """The Node changed; True when the plugin's rule changed (RuleError: the rule is kept)."""
        return False


P_co = TypeVar("P_co", bound=HookPlugin, covariant=True)


@dataclass(frozen=True, slots=True)
class HookSpec(Generic[P_co]):
    """A hook module's declaration: its name, its feature gate and how to build its plugin."""

    name: str
    gate: str
    build: Callable[[HookOptions], P_co]


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
    # stage -> its hooks as the tuple `hooks` returns, built on registration (not a copy per call)
    _ordered: dict[Stage, tuple[RegisteredHook, ...]] = field(
        default_factory=lambda: dict.fromkeys(STAGES, ())
    )

    def register(self, stage: Stage, name: str, description: str, fn: HookFn) -> None:
        """Add a hook; a duplicate name in a stage is a programming error."""
        hooks = self._by_stage[stage]
        if any(h.name == name for h in hooks):
            raise ValueError(f"hook {name!r} already registered at stage {stage}")
        hooks.append(RegisteredHook(name, description, fn))
        hooks.sort(key=lambda h: h.name)
        self._ordered[stage] = tuple(hooks)

    def hooks(self, stage: Stage) -> Sequence[RegisteredHook]:
        """Hooks of `stage` in execution order."""
        return self._ordered[stage]

    def stages(self, disabled: frozenset[Stage] = frozenset()) -> list[Stage]:
        """Stages with at least one hook, not disabled, in the fixed stage order (deterministic)."""
        return [s for s in STAGES if self._by_stage[s] and s not in disabled]
