"""RuntimeHookService (runtime.v1alpha1) for koord-runtime-proxy, served with grpclib.

Every call (docs/behaviour-runtime-hooks.md, "Proxy mode"): decode → hook context (`FromProxy`) → the hook
core's `run_call` within the caller's deadline, its handler running the stage (`HookCore.stage`; pod stages
also write the pod cgroups before the reply, as on the NRI path) → the request-prefilled response with the
hooks' values merged (`ProxyDone`). Outcomes:

* bytes that are not the request message, or a request the hooks cannot safely use: INVALID_ARGUMENT
  (logged once, counted); the server keeps serving;
* a hook error or an overrun under the Fail policy: UNKNOWN with the error (a Go handler returning a plain
  error), and nothing was written (docs/behaviour-runtime-hooks.md, "Project decisions"); under Ignore the
  response is returned;
* a bug of ours: UNKNOWN under Fail, the unchanged (pre-filled) response under Ignore.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from google.protobuf.message import DecodeError
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from koordqos.bus import EventBus
from koordqos.config import FailurePolicy
from koordqos.errors import HookError, TimeoutException
from koordqos.hooks.context import ContainerContext, HookContext, PodContext, Stage
from koordqos.hooks.core import STRATEGY, Call, HookCore, call_deadline, run_call
from koordqos.once import SeenOnce
from koordqos.proxy import telemetry as m
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.proxy.api.runtime_api_grpc import RuntimeHookServiceBase
from koordqos.proxy.convert import ProxyConverter, ProxyRequestError, container_response, pod_response
from koordqos.state import NodeState

if TYPE_CHECKING:
    from grpclib.server import Stream

    from koordqos.decisions import DecisionLog

log = structlog.get_logger("koordqos.proxy")

DEFAULT_REQUEST_TIMEOUT = 2.0  # seconds, when the caller sends no grpc-timeout
MAX_MESSAGE_BYTES = 4 << 20  # grpc-go's default receive limit

# RPC → stage (docs/behaviour-runtime-hooks.md, "Proxy mode"); the registration file lists only stages that
# have an RPC
POD_RPCS: dict[str, Stage] = {
    "PreRunPodSandboxHook": Stage.PRE_RUN_POD_SANDBOX,
    "PostStopPodSandboxHook": Stage.POST_STOP_POD_SANDBOX,
}
CONTAINER_RPCS: dict[str, Stage] = {
    "PreCreateContainerHook": Stage.PRE_CREATE_CONTAINER,
    "PreStartContainerHook": Stage.PRE_START_CONTAINER,
    "PostStartContainerHook": Stage.POST_START_CONTAINER,
    "PostStopContainerHook": Stage.POST_STOP_CONTAINER,
    "PreUpdateContainerResourcesHook": Stage.PRE_UPDATE_CONTAINER_RESOURCES,
}
RPC_STAGES = frozenset(POD_RPCS.values()) | frozenset(CONTAINER_RPCS.values())

Req = TypeVar("Req")
T = TypeVar("T")
C = TypeVar("C", PodContext, ContainerContext)
_INVALID_SEEN: SeenOnce[str] = SeenOnce(1024)

ProxyHandler = Callable[[Call, Stage, HookContext, NodeState], Awaitable[None] | None]


def no_hooks(call: Call, stage: Stage, ctx: HookContext, state: NodeState) -> None:
    """The handler of a service without runtime hooks: replies are the pre-filled requests."""


def core_handler(core: HookCore) -> ProxyHandler:
    """Run each call's stage through the hook core (koordlet RunHooks); pod stages write the pod cgroups
    before the reply (injectForExt)."""

    def handle(call: Call, stage: Stage, ctx: HookContext, state: NodeState) -> Awaitable[None] | None:
        if isinstance(ctx, PodContext):
            req = ctx.request
            return core.pod_stage(call, stage, ctx, state, f"proxy {stage} {req.namespace}/{req.name}")
        core.stage(call, stage, ctx, state)
        return None

    return handle


class _Reply(Exception):
    """Internal: answer with this status (outcome label for the metric)."""

    def __init__(self, status: Status, message: str, outcome: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.outcome = outcome


class RuntimeHookService(RuntimeHookServiceBase):
    """The seven hook RPCs; each is one call of the hook core."""

    def __init__(
        self,
        bus: EventBus,
        converter: ProxyConverter,
        policy: FailurePolicy = "Ignore",
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        decisions: DecisionLog | None = None,
        handler: ProxyHandler = no_hooks,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.bus = bus  # NodeState for the conversion (read only)
        self.max_message_bytes = max_message_bytes
        self.converter = converter
        self.handler = handler
        self.policy = policy
        self.decisions = decisions
        self.request_timeout = request_timeout
        self.timings: dict[str, list[float]] | None = None  # set by benchmarks

    # -- the RPCs ---------------------------------------------------------------------------------

    async def PreRunPodSandboxHook(
        self, stream: Stream[rpb.PodSandboxHookRequest, rpb.PodSandboxHookResponse]
    ) -> None:
        """Before RunPodSandbox: batch resources, bvt, … written to the pod cgroup and returned."""
        await self._serve_pod(stream, "PreRunPodSandboxHook")

    async def PostStopPodSandboxHook(
        self, stream: Stream[rpb.PodSandboxHookRequest, rpb.PodSandboxHookResponse]
    ) -> None:
        """After StopPodSandbox."""
        await self._serve_pod(stream, "PostStopPodSandboxHook")

    async def PreCreateContainerHook(
        self, stream: Stream[rpb.ContainerResourceHookRequest, rpb.ContainerResourceHookResponse]
    ) -> None:
        """Before CreateContainer: the container's resources (batch, cpuset, normalized quota)."""
        await self._serve_container(stream, "PreCreateContainerHook")

    async def PreStartContainerHook(
        self, stream: Stream[rpb.ContainerResourceHookRequest, rpb.ContainerResourceHookResponse]
    ) -> None:
        """Before StartContainer."""
        await self._serve_container(stream, "PreStartContainerHook")

    async def PostStartContainerHook(
        self, stream: Stream[rpb.ContainerResourceHookRequest, rpb.ContainerResourceHookResponse]
    ) -> None:
        """After StartContainer."""
        await self._serve_container(stream, "PostStartContainerHook")

    async def PostStopContainerHook(
        self, stream: Stream[rpb.ContainerResourceHookRequest, rpb.ContainerResourceHookResponse]
    ) -> None:
        """After StopContainer."""
        await self._serve_container(stream, "PostStopContainerHook")

    async def PreUpdateContainerResourcesHook(
        self, stream: Stream[rpb.ContainerResourceHookRequest, rpb.ContainerResourceHookResponse]
    ) -> None:
        """Before UpdateContainerResources: the resources to apply."""
        await self._serve_container(stream, "PreUpdateContainerResourcesHook")

    # -- shared shape -----------------------------------------------------------------------------

    async def _serve_pod(
        self, stream: Stream[rpb.PodSandboxHookRequest, rpb.PodSandboxHookResponse], method: str
    ) -> None:
        received = time.monotonic()
        outcome = "ok"
        try:
            req = await self._recv(stream, method)
            ctx: PodContext | None = None
            try:
                ctx = self._convert(lambda: self.converter.pod_context(req, self.bus.state, method), method)
                await self._request(method, POD_RPCS[method], ctx, stream, received)
            except _Reply:
                raise
            except Exception as exc:
                outcome = self._internal_error(method, exc)
                ctx = None
            ctx = self._unless_dry_run(ctx, method, f"{req.pod_meta.namespace}/{req.pod_meta.name}")
            await stream.send_message(pod_response(req, ctx))
        except _Reply as reply:
            outcome = reply.outcome
            raise GRPCError(reply.status, reply.message) from None
        finally:
            self._observe(method, outcome, received)

    async def _serve_container(
        self,
        stream: Stream[rpb.ContainerResourceHookRequest, rpb.ContainerResourceHookResponse],
        method: str,
    ) -> None:
        received = time.monotonic()
        outcome = "ok"
        try:
            req = await self._recv(stream, method)
            ctx: ContainerContext | None = None
            try:
                ctx = self._convert(
                    lambda: self.converter.container_context(req, self.bus.state, method), method
                )
                await self._request(method, CONTAINER_RPCS[method], ctx, stream, received)
            except _Reply:
                raise
            except Exception as exc:
                outcome = self._internal_error(method, exc)
                ctx = None
            target = f"{req.pod_meta.namespace}/{req.pod_meta.name}/{req.container_meta.name}"
            ctx = self._unless_dry_run(ctx, method, target)
            await stream.send_message(container_response(req, ctx))
        except _Reply as reply:
            outcome = reply.outcome
            raise GRPCError(reply.status, reply.message) from None
        finally:
            self._observe(method, outcome, received)

    def _unless_dry_run(self, ctx: C | None, method: str, target: str) -> C | None:
        """In --dry-run the proxy gets its request back unchanged; a decision records what would change."""
        if ctx is None or self.decisions is None or not self.decisions.dry_run:
            return ctx
        self.decisions.record(
            STRATEGY,
            target,
            "proxy-adjust",
            None,
            repr(ctx.response.resources),
            method,
            dry_run=True,
            quiet=True,
        )
        return None

    async def _recv(self, stream: Stream[Req, Any], method: str) -> Req:
        # grpclib has no receive limit and reads a whole message before decoding it: read the 5-byte
        # length prefix first and refuse an oversized message before its bytes are buffered, as grpc-go does
        # (grpclib's message framing, read through the server stream's protocol stream)
        h2: Any = stream._stream
        meta = await h2.recv_data(5)
        if len(meta) < 5:
            raise self._invalid(method, "no request message")
        if meta[0]:
            raise self._invalid(method, "compressed messages are not supported")
        length = int.from_bytes(meta[1:5], "big")
        if length > self.max_message_bytes:
            raise self._too_large(method, length)
        data = await h2.recv_data(length)
        try:
            req: Req = stream._codec.decode(data, stream._recv_type)
        except (DecodeError, ValueError) as exc:
            raise self._invalid(method, f"request does not parse: {exc}") from None
        except Exception as exc:  # e.g. RecursionError from deep nesting: still only this request
            raise self._invalid(method, f"request does not parse: {type(exc).__name__}") from None
        return req

    def _too_large(self, method: str, length: int) -> _Reply:
        message = f"received message larger than max ({length} vs. {self.max_message_bytes})"
        if _INVALID_SEEN.first(f"{method}:too-large"):
            log.warning("oversized runtime hook request refused", method=method, size=length)
        return _Reply(Status.RESOURCE_EXHAUSTED, message, "resource_exhausted")

    def _convert(self, build: Callable[[], T], method: str) -> T:
        try:
            return build()
        except ProxyRequestError as exc:
            raise self._invalid(method, str(exc)) from None

    @staticmethod
    def _invalid(method: str, message: str) -> _Reply:
        # counted per request (by _observe); logged once per distinct problem so a misbehaving caller
        # cannot flood the log
        key = f"{method}:{message}"
        if _INVALID_SEEN.first(key):
            log.warning("invalid runtime hook request", method=method, error=message)
        return _Reply(Status.INVALID_ARGUMENT, message, "invalid_argument")

    def _internal_error(self, method: str, exc: Exception) -> str:
        """A bug of ours: never fail the pod under Ignore (the pre-filled reply goes back)."""
        log.error(
            "runtime hook request failed unexpectedly",
            method=method,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
        if self.policy == "Fail":
            raise _Reply(Status.UNKNOWN, f"{type(exc).__name__}: {exc}", "internal_error") from exc
        return "internal_error"

    async def _request(
        self, method: str, stage: Stage, ctx: HookContext, stream: Stream[Any, Any], received: float
    ) -> None:
        # the caller's grpc-timeout when it sends one (elapsed time is already out of it)
        budget = self.request_timeout
        elapsed = time.monotonic() - received
        if stream.deadline is not None:
            budget, elapsed = stream.deadline.time_remaining(), 0.0
        deadline = call_deadline(budget, elapsed)
        state = self.bus.state
        handler = self.handler
        try:
            await run_call(method, deadline, self.policy, lambda call: handler(call, stage, ctx, state))
        except (HookError, TimeoutException) as exc:
            # only under Fail: nothing was written, the proxy applies its own failure policy
            raise _Reply(Status.UNKNOWN, str(exc), "hook_error") from None

    def _observe(self, method: str, outcome: str, received: float) -> None:
        took = time.monotonic() - received
        m.REQUESTS.labels(method, outcome).inc()
        m.REQUEST_SECONDS.labels(method).observe(took)
        if self.timings is not None:
            self.timings.setdefault(method, []).append(took)
