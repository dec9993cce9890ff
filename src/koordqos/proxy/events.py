"""Bus request events for RuntimeHookService calls: one per call, carrying the stage and the hook context.

The service turns every gRPC call into one `bus.request(event, deadline, policy)`; `ProxyHooks` (and any
other hook registered with `bus.register_hook(ProxyPodHook, ...)`) fills `event.ctx.response`.
"""

from __future__ import annotations

from dataclasses import dataclass

from koordqos.events.types import RequestEvent
from koordqos.hooks.context import ContainerContext, PodContext, Stage


@dataclass(slots=True, eq=False)
class ProxyPodHook(RequestEvent):
    """PreRunPodSandboxHook / PostStopPodSandboxHook: run `stage` on the pod context."""

    stage: Stage
    ctx: PodContext


@dataclass(slots=True, eq=False)
class ProxyContainerHook(RequestEvent):
    """A container hook call (create, start, post-start, post-stop, update): run `stage` on the context."""

    stage: Stage
    ctx: ContainerContext
