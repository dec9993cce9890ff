"""`TopologyReporter`: recomputes the NodeResourceTopology every 3 s and right after pod/Node changes, hands
the result to the CPUSetAllocator hook at once, and writes only when the result changed or at the resync
period (which also recreates a deleted NRT); `KubeletSources`, where the kubelet's CPU manager state comes
from."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from koordqos import observability as obs
from koordqos.bus import EventBus, always
from koordqos.errors import KubeError, ModelError
from koordqos.events.types import (
    Event,
    NodeUpdated,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RuntimeSandbox,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
)
from koordqos.kube.reportwriters import (
    NRTWriter,
    WriteOutcome,
)
from koordqos.localsources import pod_from_sandbox
from koordqos.metrics.hardware import NodeHardware
from koordqos.metrics.procfs import read_text
from koordqos.metrics.topology import CpuTopology
from koordqos.model.node import NodeInfo
from koordqos.model.pod import PodInfo
from koordqos.model.wirevalue import FieldProblem
from koordqos.once import SeenOnce
from koordqos.report.format import rfc3339
from koordqos.report.kubelet import (
    CheckpointState,
    KubeletCPUManager,
    choose,
    from_checkpoint,
    from_configz,
    parse_checkpoint,
)
from koordqos.report.nrt import NRTDesired, NRTInputs, desired, modifier
from koordqos.report.record import Json, ReportRecord, report_invalid_fields
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.report")


@dataclass(frozen=True, slots=True)
class KubeletSources:
    """The kubelet sources' inputs: the explicit configuration, a configz fetcher and the kubelet root."""

    explicit: KubeletCPUManager | None = None
    configz: Callable[[], Awaitable[Json]] | None = None
    kubelet_root: Path = Path("/var/lib/kubelet")
    configz_refresh_seconds: float = 300.0


# the runtime's sandboxes count too (`TopologyReporter.node_pods`)
_NRT_TRIGGERS = (
    PodUpserted,
    PodDeleted,
    PodsReplaced,
    NodeUpdated,
    RuntimeSandboxUpserted,
    RuntimeSandboxRemoved,
    RuntimeSynchronized,
)


class TopologyReporter:
    """The "nrt-reporter" component; `writer` None computes locally only (N6)."""

    name = "nrt-reporter"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        node_name: str,
        topology: CpuTopology,
        hardware: NodeHardware,
        writer: NRTWriter | None,
        *,
        kubelet: KubeletSources | None = None,
        hugepage_report: bool = False,
        interval: float = 3.0,
        resync: float = 60.0,
        on_topology: Callable[[NRTDesired], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.node_name = node_name
        self.topology = topology
        self.hardware = hardware
        self.writer = writer
        self.kubelet = kubelet or KubeletSources()
        self.hugepage_report = hugepage_report
        self.interval = interval
        self.resync = resync
        self.on_topology = on_topology
        self.clock = clock
        self.wall = wall
        self.current: NRTDesired | None = None
        self.last: ReportRecord | None = None
        self._written: NRTDesired | None = None
        self._synced_at: float | None = None
        self._configz: KubeletCPUManager | None = None
        self._configz_at: float | None = None
        self._said: SeenOnce[str] = SeenOnce()
        self._nrt_problems: frozenset[tuple[str, str, str]] = frozenset()  # of the NRT last read
        self._wake = asyncio.Event()
        self._checkpoint_text: str | None = None
        self._checkpoint_state: CheckpointState | None = None
        # the inputs of the last computation: unchanged inputs reuse its result (the 3 s timer costs ~nothing)
        self._last_inputs: NRTInputs | None = None
        self._last_desired: NRTDesired | None = None
        self._sandbox_pods: dict[str, tuple[RuntimeSandbox, PodInfo]] = {}  # sandbox id → its PodInfo
        bus.subscribe("nrt-triggers", self._on_change, *_NRT_TRIGGERS, immediate=always(self._on_change))

    def _on_change(self, event: Event, state: NodeState) -> None:
        self._wake.set()

    def _warn_once(self, key: str, msg: str, level: str = "warning", **kw: object) -> None:
        if self._said.first(key):
            getattr(log, level)(msg, **kw)

    def _checkpoint(self) -> CheckpointState | None:
        path = self.kubelet.kubelet_root / "cpu_manager_state"
        text = read_text(path)
        if text is None:
            return None
        if text == self._checkpoint_text:
            return self._checkpoint_state
        self._checkpoint_text = text
        self._checkpoint_state = None
        try:
            self._checkpoint_state = parse_checkpoint(text)
            return self._checkpoint_state
        except ModelError as exc:
            self._warn_once(
                "checkpoint:" + str(exc), "kubelet checkpoint unreadable", path=str(path), error=str(exc)
            )
            return None

    async def _from_configz(self) -> KubeletCPUManager | None:
        fetch = self.kubelet.configz
        if fetch is None:
            return None
        now = self.clock()
        if self._configz_at is not None and now - self._configz_at < self.kubelet.configz_refresh_seconds:
            return self._configz
        self._configz_at = now
        try:
            self._configz = from_configz(await fetch())
        except (KubeError, ModelError) as exc:
            self._warn_once("configz", "kubelet /configz unavailable; using the checkpoint", error=str(exc))
            self._configz = None
        return self._configz

    def node_pods(self, state: NodeState) -> tuple[PodInfo, ...]:
        """The pods the NRT is computed from: NodeState's (the API server's; local mode's from NRI), then the
        runtime's sandboxes no PodInfo stands for yet. The NRI Synchronize delivers them before the local pod
        source or the API server has: a pod pinned to CPUs holds them from the moment it runs, and the
        CPUSetAllocator answering that Synchronize must leave them out of the share pools already."""
        pods = state.pods
        memo = self._sandbox_pods
        kept: dict[str, tuple[RuntimeSandbox, PodInfo]] = {}
        extra: list[PodInfo] = []
        for sb in state.sandboxes.values():
            hit = memo.get(sb.id)
            if hit is None or hit[0] is not sb:
                hit = (sb, pod_from_sandbox(sb, self.node_name))
            kept[sb.id] = hit
            if hit[1].uid not in pods:
                extra.append(hit[1])
        self._sandbox_pods = kept
        return (*pods.values(), *extra)

    def desired_for(self, state: NodeState) -> NRTDesired | None:
        """The NRT content of `state` with the kubelet facts of the last round, synchronously (the
        CPUSetAllocator's share pools, computed from the state a reconcile pass or the NRI Synchronize plans
        from); None before the first round asked the kubelet, or when the node facts contradict each other."""
        last = self._last_inputs
        if last is None:
            return None
        return self._desired(replace(last, node=state.node, pods=self.node_pods(state)))

    def _desired(self, inputs: NRTInputs) -> NRTDesired | None:
        """`desired(inputs)`, reusing the last result for equal inputs (the 3 s timer then costs ~nothing)."""
        last = self._last_inputs
        if (
            last is not None
            and self._last_desired is not None
            and last.node is inputs.node
            and last.checkpoint is inputs.checkpoint
            and last.kubelet == inputs.kubelet
            and last.pods == inputs.pods  # identity of each PodInfo first: cheap when nothing changed
        ):
            return self._last_desired
        try:
            want = desired(inputs)
        except ModelError as exc:
            obs.ERRORS.labels(self.name, "ModelError").inc()
            self._warn_once("desired:" + str(exc), "NodeResourceTopology not computed", error=str(exc))
            return None
        for problem in want.problems:
            self._warn_once(problem, "pod ignored for the CPU share pools", problem=problem)
        self._last_inputs, self._last_desired = inputs, want
        return want

    async def compute(self, state: NodeState | None = None) -> NRTDesired | None:
        """The NRT content now (None when the node facts contradict each other: logged once)."""
        checkpoint = self._checkpoint()
        explicit = self.kubelet.explicit
        kubelet = choose(
            explicit,
            None if explicit is not None else await self._from_configz(),
            from_checkpoint(checkpoint) if checkpoint is not None else None,
        )
        if kubelet is None:
            self._warn_once(
                # no kubelet to ask is normal in local mode: not a problem
                "no-kubelet",
                "kubelet CPU manager unknown; its NRT annotations are left as they are",
                level="info",
            )
        elif kubelet.source == "checkpoint" and kubelet.policy == "static":
            self._warn_once(
                "static-no-reserved", "kubelet static CPU policy from the checkpoint: reservedCPUs unknown"
            )
        # the state after the awaits above: what is pushed to the hooks (`on_topology`) is of the state now
        state = self.bus.state if state is None else state
        inputs = NRTInputs(
            node_name=self.node_name,
            node=state.node,
            topology=self.topology,
            hardware=self.hardware,
            pods=self.node_pods(state),
            kubelet=kubelet,
            checkpoint=checkpoint,
            hugepage_report=self.hugepage_report,
        )
        return self._desired(inputs)

    async def round(self) -> ReportRecord | None:
        """Recompute; publish pools; write when changed or due for a resync."""
        want = await self.compute()
        if want is None:
            return self.last
        # local users (the CPUSetAllocator hook) get the result at once, before any API write (N5)
        changed = self.current is None or want.annotations != self.current.annotations
        if changed and self.on_topology is not None:
            self.on_topology(want)
        self.current = want
        now = rfc3339(self.wall())
        if self.writer is None:
            self.last = ReportRecord(now, "computed")
            return self.last
        due = self._synced_at is None or self.clock() - self._synced_at >= self.resync
        if want == self._written and not due:
            return self.last
        node: NodeInfo | None = self.bus.state.node
        found: list[FieldProblem] = []
        out: WriteOutcome = await self.writer.sync(
            modifier(want, self.node_name, node.uid if node else "", found)
        )
        # the problems of the object read (once each even when a conflict made it read again)
        unique = tuple({p.key: p for p in found}.values())
        self._nrt_problems = report_invalid_fields(
            "NodeResourceTopology", unique, self._nrt_problems, node=self.node_name
        )
        written_at = self.last.written_at if self.last is not None else ""
        if out.outcome in ("written", "unchanged"):
            self._written = want
            self._synced_at = self.clock()
            if out.outcome == "written":
                written_at = now
        self.last = ReportRecord(now, out.outcome, out.detail, written_at, self.writer.last)
        return self.last

    async def run(self) -> None:
        """Every `interval`, or sooner after a pod/Node change."""
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                obs.ERRORS.labels(self.name, type(exc).__name__).inc()
                log.exception("NodeResourceTopology round failed")
            self._wake.clear()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result when the wake-up and
            # a cancellation land in the same loop step, losing the cancellation (the agent then waited for
            # this component forever at SIGTERM while pod events were arriving)
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                continue
            await asyncio.sleep(0.05)  # let a burst of pod events settle into one round

    def debug_state(self) -> Json:
        """The last NRT round (for /debug/state)."""
        last = self.last
        pools = self.current.pools if self.current is not None else None
        return {
            "pools": None
            if pools is None
            else {"ls": [p.json() for p in pools.ls], "be": [p.json() for p in pools.be]},
            "last": None
            if last is None
            else {
                "builtAt": last.built_at,
                "outcome": last.outcome,
                "detail": last.detail,
                "writtenAt": last.written_at,
            },
        }
