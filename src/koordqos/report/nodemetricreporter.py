"""`NodeMetricReporter`: keeps the report history (fed by every MetricTick), reads the NodeMetric's spec, and
every report interval builds the status and hands it to the writer (docs/reporting.md). The first report is
one interval after start; nothing is written before the NodeMetric was seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

import structlog

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.errors import KubeError
from koordqos.events.types import (
    Event,
    MetricTick,
)
from koordqos.kube.reportwriters import (
    REPORTS,
    NodeMetricWriter,
)
from koordqos.metrics.types import MetricSnapshot
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.once import SeenOnce
from koordqos.report.format import rfc3339
from koordqos.report.history import ReportHistory
from koordqos.report.nodemetric import AppMeta, PodMeta, StatusSkipped, build_status, plan_status
from koordqos.report.policy import SCHEDULER_EXPIRY_SECONDS, CollectPolicy, parse_collect_policy
from koordqos.report.prediction import PredictionServer
from koordqos.report.record import Json, ReportRecord, Sleep, report_invalid_fields
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.report")
PODS_PER_STEP = 100  # a report's pod metadata is built in slices this long (the loop gets a turn between)


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
