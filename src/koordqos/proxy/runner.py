"""ProxyHooks: runs the runtime hooks for RuntimeHookService bus requests (koordlet RunHooks + ProxyDone).

The same `RuntimeHooks` runner, rules and pod-cgroup completion as the NRI path (`koordqos.nri.convert`),
so every hook behaves identically in both modes. Pod stages write the pod cgroups through the executor
(koordlet's injectForExt) before the reply; under the Fail policy a hook error raises before anything is
written (project decision §8.8).
"""

from __future__ import annotations

from koordqos.cgroups.executor import CgroupExecutor
from koordqos.events.bus import EventBus
from koordqos.hooks.completion import pod_writes
from koordqos.hooks.framework import FailurePolicy
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.nri.convert import STRATEGY
from koordqos.proxy.events import ProxyContainerHook, ProxyPodHook
from koordqos.state import NodeState

HOOK_NAME = "koordqos-runtime-hooks"


class ProxyHooks:
    """Attaches the runtime hooks to the proxy request events."""

    def __init__(
        self, hooks: RuntimeHooks, executor: CgroupExecutor | None, policy: FailurePolicy = "Ignore"
    ) -> None:
        self.hooks = hooks
        self.executor = executor
        self.policy = policy

    def register(self, bus: EventBus) -> None:
        """Register on the proxy request events."""
        bus.register_hook(ProxyPodHook, HOOK_NAME, self.pod_hook)
        bus.register_hook(ProxyContainerHook, HOOK_NAME, self.container_hook)

    async def pod_hook(self, event: ProxyPodHook, state: NodeState) -> None:
        """Run the pod stage, then write the pod-level values to the pod cgroup."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        self.hooks.run_stage(event.stage, event.ctx, self.policy)
        writes = pod_writes(event.ctx)
        if writes and self.executor is not None:
            req = event.ctx.request
            await self.executor.apply(
                STRATEGY, writes, reason=f"proxy {event.stage} {req.namespace}/{req.name}"
            )

    def container_hook(self, event: ProxyContainerHook, state: NodeState) -> None:
        """Run the container stage; its values go into the gRPC reply."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        self.hooks.run_stage(event.stage, event.ctx, self.policy)
