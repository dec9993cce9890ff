"""The reporter components: thin loops around the pure planners and the kube actuators.

* `NodeMetricReporter` keeps the report history (fed by every MetricTick), reads the NodeMetric's spec, and
  every report interval builds the status and hands it to the writer (§1.7). The first report is one
  interval after start; nothing is written before the NodeMetric was seen.
* `TopologyReporter` recomputes the NRT every 3 s and right after pod/Node changes, hands the result to
  the CPUSetAllocator hook at once (N5), and writes only when the result changed (N4) or at the
  resync period (which also recreates a deleted NRT).
* `BatchCapacityReporter` (standalone, `--batch-resource-source=agent`) patches the Node's batch and Mid
  resources computed with koord-manager's formulas from the same report (Mid from its
  prodReclaimableMetric), and removes them after 15 minutes without a usable report (the manager's degrade
  rule).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.bus import EventBus, always
from koordqos.errors import ConfigError, KubeError, ModelError
from koordqos.events.types import (
    Event,
    MetricTick,
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
    REPORTS,
    NodeBatchPatcher,
    NodeMetricWriter,
    NRTWriter,
    WriteOutcome,
)
from koordqos.localsources import pod_from_sandbox
from koordqos.metrics.hardware import NodeHardware
from koordqos.metrics.procfs import read_text
from koordqos.metrics.topology import CpuTopology
from koordqos.metrics.types import MetricSnapshot
from koordqos.model.keys import MID_CPU, MID_MEMORY
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.model.wirevalue import FieldProblem
from koordqos.once import SeenOnce
from koordqos.report.batch import (
    BATCH_CPU,
    BATCH_MEMORY,
    BatchStrategy,
    ManagedPod,
    NodeCapacity,
    calculate,
    needs_sync,
)
from koordqos.report.format import decimal_quantity, memory_quantity, rfc3339
from koordqos.report.history import ReportHistory
from koordqos.report.kubelet import (
    CheckpointState,
    KubeletCPUManager,
    choose,
    from_checkpoint,
    from_configz,
    parse_checkpoint,
)
from koordqos.report.mid import MidNode, MidPod, MidStrategy
from koordqos.report.mid import calculate as calculate_mid
from koordqos.report.nodemetric import AppMeta, PodMeta, StatusSkipped, build_status, plan_status
from koordqos.report.nrt import NRTDesired, NRTInputs, desired, modifier
from koordqos.report.policy import SCHEDULER_EXPIRY_SECONDS, CollectPolicy, parse_collect_policy
from koordqos.report.prediction import PredictionServer
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.report")
Json = dict[str, Any]
Sleep = Callable[[float], Awaitable[None]]
#: what the standalone mode sets on the Node (capacity and allocatable)
STANDALONE_RESOURCES = (BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY)
PODS_PER_STEP = 100  # a report's pod metadata is built in slices this long (the loop gets a turn between)
INVALID_FIELDS = Counter(
    "koordqos_report_invalid_fields_total",
    "Fields of API objects the reporters read that were rejected (NaN, infinite, out of range, wrong type): "
    "the last valid value or the default kept; each problem counted when it appears",
    ["kind"],
    registry=obs.REGISTRY,
)


def report_invalid_fields(
    kind: str, problems: tuple[FieldProblem, ...], before: frozenset[tuple[str, str, str]], **context: object
) -> frozenset[tuple[str, str, str]]:
    """Log and count the problems not already in `before` (the last object's); returns this object's set, so a
    re-read of the same object repeats nothing and the same bad value after a valid one is reported again."""
    for problem in problems:
        if problem.key not in before:
            INVALID_FIELDS.labels(kind).inc()
            obs.ERRORS.labels("report", "invalid-field").inc()
            log.error(
                f"{kind} field rejected; keeping its last valid value", problem=problem.describe(), **context
            )
    return frozenset(p.key for p in problems)


@dataclass(frozen=True, slots=True)
class ReportRecord:
    """The last round of a reporter, for /debug/state."""

    built_at: str  # RFC 3339
    outcome: str
    detail: str = ""
    written_at: str = ""  # RFC 3339 of the last successful write
    body: Json | None = None


class NodeMetricReporter:
    """The "nodemetric-reporter" component."""

    name = "nodemetric-reporter"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        history: ReportHistory,
        writer: NodeMetricWriter | None,
        *,
        wall: Callable[[], float] = time.time,
        sleep: Sleep = asyncio.sleep,
        prediction: PredictionServer | None = None,
    ) -> None:
        self.bus = bus
        self.history = history
        self.writer = writer
        self.prediction = prediction  # the prodReclaimableMetric / prodPeakMetric fields (None: omitted)
        self.wall = wall
        self.sleep = sleep
        self.policy = CollectPolicy()
        self.last: ReportRecord | None = None
        self.last_written_at = ""
        self._pods: Mapping[str, PodInfo] | None = None  # the state's pods map retain_pods last saw
        self._node_slo: NodeSLO | None = None
        self._said: SeenOnce[str] = SeenOnce()
        self._spec_problems: frozenset[tuple[str, str, str]] = frozenset()  # of the spec last read
        self._state_note = ""
        # the report's pod metadata: rebuilt when the pods mapping changes, from a per-pod memo (uid → the
        # PodInfo it was made of and its PodMeta), so a pod change costs one PodMeta, not one per pod
        self._metas_for: Mapping[str, PodInfo] | None = None
        self._metas: list[PodMeta] = []
        self._meta_of: dict[str, tuple[PodInfo, PodMeta]] = {}
        self._ingest_idle = asyncio.Event()  # clear while a round is ingested in slices
        self._ingest_idle.set()
        bus.subscribe("report-history", self._on_tick_paced, MetricTick)

    def _on_tick(self, event: Event, state: NodeState) -> None:
        """Ingest a tick's round in one go."""
        for _ in self._tick_steps(event, state):
            pass

    async def _on_tick_paced(self, event: Event, state: NodeState) -> None:
        """Ingest a tick's round, giving the loop a turn between slices of pods (the bus handler)."""
        self._ingest_idle.clear()
        try:
            for _ in self._tick_steps(event, state):
                await asyncio.sleep(0)
        finally:
            self._ingest_idle.set()

    def _tick_steps(self, event: Event, state: NodeState) -> Iterator[None]:
        if not isinstance(event, MetricTick) or not isinstance(event.sample, MetricSnapshot):
            return
        yield from self.history.ingest_steps(event.sample)
        # pods/NodeSLO changed: drop gone series. By identity, not the state generation: every runtime
        # event bumps the generation (36 /s under container churn) and the pods map is only replaced on
        # pod events, so this is O(pods) per pod change instead of per tick
        if state.pods is not self._pods or state.node_slo is not self._node_slo:
            self._pods, self._node_slo = state.pods, state.node_slo
            self.history.retain_pods(state.pods.keys())
            apps = state.node_slo.host_applications if state.node_slo is not None else ()
            self.history.retain_apps({a.name for a in apps})

    def _note(self, note: str, msg: str, **kw: object) -> None:
        """Log a state change once (missing target, skipped rounds, recovery)."""
        if note != self._state_note:
            self._state_note = note
            log.warning(msg, **kw) if note else log.info(msg, **kw)

    def set_policy(self, policy: CollectPolicy) -> None:
        """Apply a NodeMetric spec: retention follows the windows; rejected fields logged and counted when
        they appear, a long interval warned once."""
        self._spec_problems = report_invalid_fields("NodeMetric", policy.problems, self._spec_problems)
        if policy.report_interval_seconds >= SCHEDULER_EXPIRY_SECONDS and self._said.first(
            f"interval:{policy.report_interval_seconds}"
        ):
            log.warning(
                "NodeMetric report interval reaches koord-scheduler's default expiry; the scheduler will "
                "treat the metric as stale between reports",
                interval=policy.report_interval_seconds,
                expiry=SCHEDULER_EXPIRY_SECONDS,
            )
        self.policy = policy
        self.history.configure(policy.node_retention, policy.pod_retention)

    def _meta_steps(self, pods: Mapping[str, PodInfo]) -> Iterator[None]:
        """Bring the pod metadata up to `pods`, stopping after every PODS_PER_STEP pods."""
        if pods is self._metas_for:
            return
        memo = self._meta_of
        meta_of: dict[str, tuple[PodInfo, PodMeta]] = {}
        metas: list[PodMeta] = []
        for i, pod in enumerate(pods.values(), 1):
            known = memo.get(pod.uid)
            meta = known[1] if known is not None and known[0] is pod else PodMeta.of(pod)
            meta_of[pod.uid] = (pod, meta)
            metas.append(meta)
            if i % PODS_PER_STEP == 0:
                yield
        self._metas_for, self._metas, self._meta_of = pods, metas, meta_of

    def _inputs(self, state: NodeState | None) -> tuple[list[PodMeta], list[AppMeta]]:
        state = self.bus.state if state is None else state
        for _ in self._meta_steps(state.pods):
            pass
        hosts = state.node_slo.host_applications if state.node_slo is not None else ()
        return self._metas, [AppMeta(a.name, a.priority, a.qos) for a in hosts]

    def build(self, state: NodeState | None = None) -> Json | StatusSkipped:
        """The status this round would write (also `koordqos report --once`), in one synchronous step."""
        state = self.bus.state if state is None else state
        pods, apps = self._inputs(state)
        wall = self.wall()
        hook = None if self.prediction is None else self.prediction.fields(state, wall)
        return build_status(self.history, self.policy, pods, apps, wall, prediction=hook)

    async def build_async(self, state: NodeState | None = None) -> Json | StatusSkipped:
        """Like `build`, giving the event loop a turn between slices of pods (no long loop step)."""
        state = self.bus.state if state is None else state
        for _ in self._meta_steps(state.pods):
            await asyncio.sleep(0)
        pods, apps = self._inputs(state)
        await self._ingest_idle.wait()  # not in the middle of a round: its windows end now
        wall = self.wall()
        hook = None if self.prediction is None else self.prediction.fields(state, wall)
        steps = plan_status(self.history, self.policy, pods, apps, wall, prediction=hook)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: Json | StatusSkipped = done.value
                return result
            await asyncio.sleep(0)

    async def refresh_policy(self) -> bool:
        """GET the NodeMetric and apply its spec; False when it does not exist (or cannot be read)."""
        if self.writer is None:
            return True
        try:
            obj = await self.writer.read()
        except KubeError as exc:
            obs.ERRORS.labels(self.name, type(exc).__name__).inc()
            self._note("read-failed", "cannot read the NodeMetric", error=str(exc))
            return False
        if obj is None:
            self._note(
                "missing",
                "NodeMetric for this node does not exist (created by koord-manager); not reporting",
            )
            return False
        spec = obj.get("spec")
        self.set_policy(parse_collect_policy(spec if isinstance(spec, dict) else None, self.policy))
        return True

    async def round(self) -> ReportRecord:
        """One report: read the spec, build, write (or record why not)."""
        now = rfc3339(self.wall())
        if not await self.refresh_policy():
            REPORTS.labels("NodeMetric", "missing").inc()
            self.last = ReportRecord(now, "missing", "NodeMetric not found", self.last_written_at)
            return self.last
        status = await self.build_async()
        if isinstance(status, StatusSkipped):
            REPORTS.labels("NodeMetric", "skipped").inc()
            self._note("skipped:" + status.reason, "NodeMetric report skipped", reason=status.reason)
            self.last = ReportRecord(now, "skipped", status.reason, self.last_written_at)
            return self.last
        if self.writer is None:
            self.last = ReportRecord(now, "computed", "", self.last_written_at, status)
            return self.last
        out = await self.writer.write(status)
        if out.outcome == "written":
            # the written status's own time: `now` was read before the NodeMetric GET and the build, seconds
            # earlier on a loaded node
            self.last_written_at = str(status.get("updateTime") or now)
            self._note("", "NodeMetric status written", resource_version=out.resource_version)
        elif out.outcome == "failed":
            self._note("failed", "NodeMetric status write failed", error=out.detail, attempts=out.attempts)
        self.last = ReportRecord(now, out.outcome, out.detail, self.last_written_at, status)
        return self.last

    async def run(self) -> None:
        """Report every interval until cancelled (the first report one interval after start)."""
        await self._guarded(self.refresh_policy, "NodeMetric spec read failed")
        while True:
            await self.sleep(self.policy.report_interval_seconds)
            await self._guarded(self.round, "NodeMetric report round failed")

    async def _guarded(self, step: Callable[[], Awaitable[object]], what: str) -> None:
        """One step; a failure is counted and logged, never the end of reporting."""
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one bad round must not stop reporting
            obs.ERRORS.labels(self.name, type(exc).__name__).inc()
            log.exception(what)

    def debug_state(self) -> Json:
        """Last report and when it was written (for /debug/state)."""
        last = self.last
        return {
            "policy": {
                "aggregateDurationSeconds": self.policy.aggregate_seconds,
                "reportIntervalSeconds": self.policy.report_interval_seconds,
                "durations": list(self.policy.durations),
                "nodeMemoryCollectPolicy": self.policy.memory_policy,
            },
            "historyBytes": self.history.nbytes(),
            "last": None
            if last is None
            else {
                "builtAt": last.built_at,
                "outcome": last.outcome,
                "detail": last.detail,
                "writtenAt": last.written_at,
                "status": last.body,
            },
        }


@dataclass(frozen=True, slots=True)
class KubeletSources:
    """PD-10 inputs: the explicit configuration, a configz fetcher and the kubelet root."""

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


def _reservation(node: NodeInfo) -> dict[str, int]:
    """The `node.koordinator.sh/reservation` annotation's cpu/memory (reserved CPUs: 1000 milli each)."""
    annotation: dict[str, int] = {}
    res = node.reservation
    if res is not None:
        annotation = {r: v for r, v in res.resources.items() if r in ("cpu", "memory")}
        if res.reserved_cpus:
            annotation["cpu"] = len(res.reserved_cpus) * 1000
    return annotation


def standalone_values(
    state: NodeState, status: Json, strategy: BatchStrategy | None = None
) -> tuple[dict[str, int] | None, str]:
    """The manager's formula over the agent's own report and pod list: (batch values, "") or (None, why)."""
    node = state.node
    if node is None:
        return None, "Node not known yet"
    capacity = NodeCapacity(node.capacity, node.allocatable, _reservation(node), node.cpu_normalization_ratio)
    pods = [
        ManagedPod(
            p.namespace,
            p.name,
            p.priority_class.value,
            p.qos.value,
            {"cpu": p.request("cpu"), "memory": p.request("memory")},
        )
        for p in state.pods.values()
        if p.active
    ]
    result = calculate(capacity, pods, status, strategy or BatchStrategy())
    return {BATCH_CPU: result.batch_cpu, BATCH_MEMORY: result.batch_memory}, ""


def standalone_mid_values(
    state: NodeState, status: Json, strategy: MidStrategy | None = None
) -> tuple[dict[str, int] | None, str]:
    """koord-manager's Mid formula (§6) over the agent's own report (its prodReclaimableMetric) and pod
    list: (mid values, "") or (None, why)."""
    node = state.node
    if node is None:
        return None, "Node not known yet"
    pods = [
        MidPod(
            p.priority_class.value,
            p.phase,
            {"cpu": p.kube_request("cpu"), "memory": p.kube_request("memory")},
        )
        for p in state.pods.values()
    ]
    mid_node = MidNode(node.capacity, node.allocatable, _reservation(node))
    return calculate_mid(mid_node, pods, status, strategy or MidStrategy()).resources(), ""


class BatchCapacityReporter:
    """The "batch-capacity" component (standalone mode only)."""

    name = "batch-capacity"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        node_name: str,
        nodemetric: NodeMetricReporter,
        patcher: NodeBatchPatcher,
        manager_present: Callable[[], Awaitable[bool]],
        *,
        strategy: BatchStrategy | None = None,
        mid_strategy: MidStrategy | None = None,
        interval: float | None = None,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.bus = bus
        self.node_name = node_name
        self.nodemetric = nodemetric
        self.patcher = patcher
        self.manager_present = manager_present
        self.strategy = strategy or BatchStrategy()
        self.mid_strategy = mid_strategy or MidStrategy()
        self.interval = interval
        self.wall = wall
        self.clock = clock
        self.sleep = sleep
        self.started_at = clock()
        self.written: dict[str, int] | None = None
        self.written_at: float | None = None
        self.last_good: float | None = None
        self.stopped = False
        self.last: ReportRecord | None = None

    async def preflight(self) -> None:
        """Refuse standalone mode when a NodeMetric exists (koord-manager is present): ConfigError."""
        if await self.manager_present():
            raise ConfigError(
                f"--batch-resource-source=agent: NodeMetric {self.node_name!r} exists, so koord-manager "
                "computes batch resources on this cluster; use --batch-resource-source=manager"
            )

    async def compute(self, state: NodeState | None = None) -> tuple[dict[str, int] | None, str]:
        """(batch values, "") from the current report, or (None, why not)."""
        state = self.bus.state if state is None else state
        status = await self.nodemetric.build_async(state)
        if isinstance(status, StatusSkipped):
            return None, status.reason
        values, why = standalone_values(state, status, self.strategy)
        if values is None:
            return None, why
        mid, why = standalone_mid_values(state, status, self.mid_strategy)
        if mid is None:
            return None, why
        return values | mid, ""

    async def round(self) -> ReportRecord:
        now_text = rfc3339(self.wall())
        if self.stopped:
            return self.last or ReportRecord(now_text, "stopped")
        if await self.manager_present():
            self.stopped = True
            log.error("a NodeMetric appeared: koord-manager owns batch resources now; standalone mode stops")
            self.last = ReportRecord(now_text, "stopped", "NodeMetric exists")
            return self.last
        values, why = await self.compute()
        now = self.clock()
        if values is None:
            good = self.last_good if self.last_good is not None else self.started_at
            if now - good >= self.strategy.degrade_time_minutes * 60 and self.written != {}:
                out = await self.patcher.patch(dict.fromkeys(STANDALONE_RESOURCES))
                if out.outcome == "written":
                    self.written = {}
                    self.written_at = now
                log.warning("own metrics stale: batch and mid resources removed from the Node", reason=why)
                self.last = ReportRecord(now_text, "degraded", why)
            else:
                self.last = ReportRecord(now_text, "skipped", why)
            return self.last
        self.last_good = now
        since: float | None = None if self.written_at is None else now - self.written_at
        if not needs_sync(self.written or None, values, since, self.strategy):
            self.last = ReportRecord(now_text, "unchanged", "", body=dict(values))
            return self.last
        out = await self.patcher.patch(
            {
                BATCH_CPU: decimal_quantity(values[BATCH_CPU]),
                BATCH_MEMORY: memory_quantity(values[BATCH_MEMORY]),
                MID_CPU: decimal_quantity(values[MID_CPU]),
                MID_MEMORY: memory_quantity(values[MID_MEMORY]),
            }
        )
        if out.outcome == "written":
            self.written = values
            self.written_at = now
        self.last = ReportRecord(
            now_text, out.outcome, out.detail, now_text if out.outcome == "written" else "", dict(values)
        )
        return self.last

    async def run(self) -> None:
        """Every report interval until cancelled."""
        while True:
            await self.sleep(self.interval or self.nodemetric.policy.report_interval_seconds)
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                obs.ERRORS.labels(self.name, type(exc).__name__).inc()
                log.exception("batch capacity round failed")
