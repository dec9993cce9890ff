"""`BatchCapacityReporter` (standalone, `--batch-resource-source=agent`): patches the Node's batch and Mid
resources computed with koord-manager's formulas from the same report (Mid from its prodReclaimableMetric),
and removes them after 15 minutes without a usable report (the manager's degrade rule); `standalone_values`,
`standalone_mid_values`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.errors import ConfigError
from koordqos.kube.reportwriters import (
    NodeBatchPatcher,
)
from koordqos.model.keys import MID_CPU, MID_MEMORY
from koordqos.model.node import NodeInfo
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
from koordqos.report.mid import MidNode, MidPod, MidStrategy
from koordqos.report.mid import calculate as calculate_mid
from koordqos.report.nodemetric import StatusSkipped
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.report.record import Json, ReportRecord, Sleep
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.report")
#: what the standalone mode sets on the Node (capacity and allocatable)
STANDALONE_RESOURCES = (BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY)


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
    """koord-manager's Mid formula (docs/prediction.md, "Mid formula") over the agent's own report (its
    prodReclaimableMetric) and pod list: (mid values, "") or (None, why)."""
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
