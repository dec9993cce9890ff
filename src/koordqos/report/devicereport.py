"""The "device-reporter" component (gate `Accelerators`): the node's Device object, every sync interval.

Each round scans the devices off the loop (`metrics/devices.py`: device-info files, NVML when a GPU is
bound), builds the Device (`report/device.py`) and writes it when it differs from what was last written,
or at the resync period (a deleted Device is recreated). A node without devices writes none; a node whose
devices went away gets its written Device emptied (never a stale inventory). Nothing before the Node is in
NodeState (the owner reference needs its uid). In local mode (no writer) the object is only computed, for
/debug/state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.kube.device import DeviceWriter
from koordqos.metrics.devices import DeviceScan, NvmlLoader, load_pynvml, scan_devices
from koordqos.once import SeenOnce
from koordqos.report.device import device_object, merge_device
from koordqos.report.format import rfc3339

log = structlog.get_logger("koordqos.report.device")

Json = dict[str, Any]


class DeviceReporter:
    """Scan, build, write."""

    name = "device-reporter"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        node_name: str,
        sys_root: Path,
        xpu_dir: Path,
        writer: DeviceWriter | None,
        *,
        xpu_only: bool = False,
        report_empty: bool = False,
        interval: float = 3.0,
        resync: float = 60.0,
        loader: NvmlLoader = load_pynvml,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.node_name = node_name
        self.sys_root = Path(sys_root)
        self.xpu_dir = Path(xpu_dir)
        self.writer = writer
        self.xpu_only = xpu_only
        self.report_empty = report_empty
        self.interval = interval
        self.resync = resync
        self.loader = loader
        self.clock = clock
        self.wall = wall
        self.node_uid = ""
        self.current: Json | None = None
        self.outcome = ""
        self._written: Json | None = None
        self._written_at: float | None = None
        self._said: SeenOnce[str] = SeenOnce()
        self.bus = bus

    def scan(self) -> DeviceScan:
        """The node's devices now (blocking)."""
        return scan_devices(self.sys_root, self.xpu_dir, xpu_only=self.xpu_only, loader=self.loader)

    async def round(self) -> str:
        """One scan and, when needed, one write; the outcome."""
        node = self.bus.state.node
        if node is not None:
            self.node_uid = node.uid
        if not self.node_uid and self.writer is not None:
            return "waiting-for-node"
        scan = await asyncio.to_thread(self.scan)
        desired, problems = device_object(
            self.node_name, self.node_uid, scan, rfc3339(self.wall()), report_empty=self.report_empty
        )
        for key, msg in {**scan.problems, **problems}.items():
            obs.ERRORS.labels(self.name, "device_info").inc()
            if self._said.first(f"{key}:{msg}"):
                log.warning("device information ignored", source=key, error=msg)
        if desired is None and self._written is not None:
            # devices went away: empty what was written rather than leave a stale inventory
            desired = {**self._written, "spec": {"devices": []}}
        self.current = desired
        if desired is None or self.writer is None:
            self.outcome = "none" if desired is None else "computed"
            return self.outcome
        now = self.clock()
        fresh = self._written_at is not None and now - self._written_at < self.resync
        if fresh and _same(self._written, desired):
            self.outcome = "unchanged"
            return self.outcome
        result = await self.writer.sync(lambda cur: merge_device(cur, desired))
        self.outcome = result.outcome
        if result.outcome in ("written", "unchanged"):
            self._written, self._written_at = desired, now
            if not desired["spec"]["devices"] and not self.report_empty:
                self._written = None  # emptied: nothing more to keep current until devices come back
        elif self._said.first(f"write:{result.detail}"):
            log.warning("Device not written", error=result.detail)
        return self.outcome

    async def run(self) -> None:
        """Every interval."""
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                obs.ERRORS.labels(self.name, type(exc).__name__).inc()
                log.exception("Device round failed")
            await asyncio.sleep(self.interval)

    def debug_state(self) -> Json:
        """The Device last computed and the last outcome (for /debug/state)."""
        return {"outcome": self.outcome, "device": self.current}


def _same(a: Json | None, b: Json) -> bool:
    if a is None:
        return False
    return merge_device(a, b) is None
