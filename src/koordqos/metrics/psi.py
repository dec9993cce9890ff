"""Pressure stall information (PSI): the node's `/proc/pressure/{cpu,memory,io}` and, on cgroup v2, each
pod's and container's `{cpu,memory,io}.pressure`, read every collect interval (gate `PSICollector`).

On cgroup v1 with a unified hierarchy beside the controllers (hybrid: Ubuntu 20.04, Debian 10 and most
systemd nodes of that age), runc and systemd mirror every pod and container cgroup in `unified/`, and the
kernel keeps their pressure files there although no controller is attached: pod PSI is read from
`unified/<pod dir>` (`hybrid_pods`, a project decision; koordlet reads pod PSI on v2 only).

A pressure file has a `some` line (some task stalled) and, for memory and io (cpu too on kernels ≥ 5.13), a
`full` line (all non-idle tasks stalled): `some avg10=0.12 avg60=0.05 avg300=0.01 total=123456`. The kernel's
averages are percentages over 10/60/300 s; `total` is cumulative stall time in µs. Each round gives:

* the kernel's averages, exported under koordlet's metric names and labels (`koordlet_pod_psi`,
  `koordlet_container_psi`: `psi_resource_type` cpu|mem|io, `psi_precision` avg10|avg60|avg300,
  `psi_degree` some|full), so koordlet's dashboards and alerts work unchanged;
* the stall fraction of the round from the `total` delta (Δtotal µs / Δt µs, 0..1), which koordqos's own
  consumers read (`PSISnapshot`, `koordqos_node_psi_stall_ratio`): a round's figure, not a decaying average.

Parsing is pure (`parse_pressure`); files are read beneath the cgroup root without following a symlink
(`CgroupReader.read_bytes`). A missing file (v1 pods, a kernel without PSI, a vanished cgroup) is no sample.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import structlog
from prometheus_client import Gauge

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.errors import CgroupError
from koordqos.model.pod import PodInfo
from koordqos.once import SeenOnce

log = structlog.get_logger("koordqos.metrics.psi")

#: resource → (file name, koordlet's psi_resource_type label)
RESOURCES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {"cpu": ("cpu.pressure", "cpu"), "memory": ("memory.pressure", "mem"), "io": ("io.pressure", "io")}
)
PRECISIONS = ("avg10", "avg60", "avg300")
UNIFIED = "unified"  # hybrid's cgroup v2 hierarchy beside the v1 controllers
DEGREES = ("some", "full")
YIELD_AFTER_SECONDS = 0.002
_MAX_AVG = 100.0

_POD_LABELS = (
    "node",
    "pod_name",
    "pod_namespace",
    "pod_uid",
    "psi_resource_type",
    "psi_precision",
    "psi_degree",
)
POD_PSI = Gauge("koordlet_pod_psi", "Pod psi collected by koordlet", _POD_LABELS, registry=obs.REGISTRY)
CONTAINER_PSI = Gauge(
    "koordlet_container_psi",
    "Container psi collected by koordlet",
    ("node", "container_id", "container_name", *_POD_LABELS[1:]),
    registry=obs.REGISTRY,
)
NODE_STALL = Gauge(
    "koordqos_node_psi_stall_ratio",
    "Fraction of the last collect interval the node's tasks stalled on a resource (from PSI totals)",
    ("resource", "degree"),
    registry=obs.REGISTRY,
)


@dataclass(frozen=True, slots=True)
class PressureLine:
    """One line of a pressure file: the kernel's averages (percent) and the cumulative stall (µs)."""

    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True, slots=True)
class Pressure:
    """A pressure file: `some` always, `full` where the kernel has it."""

    some: PressureLine
    full: PressureLine | None = None


def _line(fields: list[str]) -> PressureLine | None:
    values: dict[str, str] = {}
    for f in fields:
        key, sep, value = f.partition("=")
        if sep:
            values[key] = value
    try:
        avgs = [float(values[p]) for p in PRECISIONS]
        total = int(values["total"])
    except (KeyError, ValueError):
        return None
    if total < 0 or any(not (0.0 <= a <= _MAX_AVG) or math.isnan(a) for a in avgs):
        return None
    return PressureLine(avgs[0], avgs[1], avgs[2], total)


def parse_pressure(data: bytes | str | None) -> Pressure | None:
    """A pressure file's content; None when it has no valid `some` line."""
    if data is None:
        return None
    text = data.decode("ascii", "replace") if isinstance(data, bytes) else data
    some = full = None
    for raw in text.splitlines():
        fields = raw.split()
        if not fields:
            continue
        if fields[0] == "some":
            some = _line(fields[1:])
        elif fields[0] == "full":
            full = _line(fields[1:])
    return None if some is None else Pressure(some, full)


@dataclass(frozen=True, slots=True)
class Stall:
    """One resource's pressure this round: the kernel's lines, and the round's stall fractions (None on the
    first round or after a counter reset)."""

    pressure: Pressure
    some_ratio: float | None = None
    full_ratio: float | None = None


Stalls = Mapping[str, Stall]  # resource ("cpu", "memory", "io") → Stall


@dataclass(frozen=True, slots=True)
class PSISnapshot:
    """One round: the node's stalls, each pod's and (by container id) each container's."""

    at: float
    node: Stalls = field(default_factory=dict)
    pods: Mapping[str, Stalls] = field(default_factory=dict)
    containers: Mapping[str, Stalls] = field(default_factory=dict)


class StallRates:
    """Round-to-round stall fractions from cumulative totals, per series key (forgotten when unseen)."""

    def __init__(self) -> None:
        self._prev: dict[str, tuple[int, float]] = {}
        self._seen: set[str] = set()

    def ratio(self, key: str, total_us: int, at: float) -> float | None:
        """Δtotal / Δt (0..1); None for a first sample, a reset or no time passed."""
        self._seen.add(key)
        prev = self._prev.get(key)
        self._prev[key] = (total_us, at)
        if prev is None or at <= prev[1] or total_us < prev[0]:
            return None
        return min(1.0, (total_us - prev[0]) / ((at - prev[1]) * 1e6))

    def stall(self, key: str, pressure: Pressure, at: float) -> Stall:
        """The Stall of `pressure` read at `at` for series `key`."""
        some = self.ratio(key + ":some", pressure.some.total_us, at)
        full = None if pressure.full is None else self.ratio(key + ":full", pressure.full.total_us, at)
        return Stall(pressure, some, full)

    def end_round(self) -> None:
        """Forget the series not seen since the last call (pods and containers that left)."""
        for key in [k for k in self._prev if k not in self._seen]:
            del self._prev[key]
        self._seen = set()


class PSICollector:
    """The "psi-collector" component: reads PSI every `interval` seconds and exports it."""

    name = "psi-collector"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        layout: CgroupLayout,
        reader: CgroupReader,
        *,
        node_name: str,
        proc_root: Path | str = "/proc",
        interval: float = 1.0,
        containers: bool = True,
        hybrid_pods: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.layout = layout
        self.reader = reader
        self.node_name = node_name
        self.proc_root = Path(proc_root)
        self.interval = interval
        self.containers = containers
        self._clock = clock
        self._rates = StallRates()
        self._warned: SeenOnce[str] = SeenOnce()
        self._exported: dict[str, list[_Series]] = {}  # pod uid → the series exported for it
        # where pod pressure files are: v2's one hierarchy, hybrid's unified/; plain v1 has none
        self._subsystem: str | None = None
        if layout.version is CgroupVersion.V2:
            self._subsystem = "cpu"
        elif layout.hybrid and hybrid_pods:
            self._subsystem = UNIFIED
        self.rounds = 0
        self.last: PSISnapshot | None = None

    async def run(self) -> None:
        """A round every `interval` seconds until cancelled; a failing round is counted and logged once."""
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad round must not stop collection
                obs.ERRORS.labels(self.name, type(exc).__name__).inc()
                if self._warned.first("round:" + type(exc).__name__):
                    log.warning("PSI round failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            await asyncio.sleep(self.interval)

    async def round(self) -> PSISnapshot:
        """Read the node's and every pod's pressure files once; export; keep the snapshot."""
        at = self._clock()
        node = self._node(at)
        pods: dict[str, Stalls] = {}
        containers: dict[str, Stalls] = {}
        exported: dict[str, list[_Series]] = {}
        if self._subsystem is not None:
            since = time.perf_counter()
            for pod in list(self.bus.state.pods.values()):
                if time.perf_counter() - since >= YIELD_AFTER_SECONDS:
                    await asyncio.sleep(0)
                    since = time.perf_counter()
                if pod.terminated:
                    continue
                self._pod(pod, at, pods, containers, exported)
        self._unexport(exported)
        self._rates.end_round()
        snap = PSISnapshot(at, node, MappingProxyType(pods), MappingProxyType(containers))
        self.last = snap
        self.rounds += 1
        return snap

    def _node(self, at: float) -> Stalls:
        out: dict[str, Stall] = {}
        for resource in RESOURCES:
            path = self.proc_root / "pressure" / resource
            try:
                data = path.read_bytes()
            except OSError:
                data = None
            pressure = parse_pressure(data)
            if pressure is None:
                if self._warned.first("node:" + resource):
                    log.info("node PSI not available", resource=resource, path=str(path))
                continue
            stall = out[resource] = self._rates.stall("node:" + resource, pressure, at)
            for degree, ratio in (("some", stall.some_ratio), ("full", stall.full_ratio)):
                if ratio is not None:
                    NODE_STALL.labels(resource, degree).set(ratio)
        return MappingProxyType(out)

    def _read(self, rel: str, key: str, at: float) -> Stalls:
        out: dict[str, Stall] = {}
        subsystem = self._subsystem or "cpu"
        for resource, (name, _label) in RESOURCES.items():
            pressure = parse_pressure(self.reader.read_bytes(rel, subsystem, name))
            if pressure is not None:
                out[resource] = self._rates.stall(f"{key}:{resource}", pressure, at)
        return MappingProxyType(out)

    def _pod(
        self,
        pod: PodInfo,
        at: float,
        pods: dict[str, Stalls],
        containers: dict[str, Stalls],
        exported: dict[str, list[_Series]],
    ) -> None:
        try:
            pod_dir = self.layout.pod_dir(pod)
        except CgroupError:
            return  # a hostile uid: refused and counted where the pod is measured
        stalls = self._read(pod_dir, "pod:" + pod.uid, at)
        if not stalls:
            return
        pods[pod.uid] = stalls
        base = (self.node_name, pod.name, pod.namespace, pod.uid)
        mine = exported.setdefault(pod.uid, [])
        mine += _export(POD_PSI, base, stalls)
        if not self.containers:
            return
        for c in pod.containers:
            if not c.container_id:
                continue
            try:
                cdir = self.layout.container_dir_in(pod_dir, c.container_id)
            except CgroupError:
                continue
            cstalls = self._read(cdir, "ctr:" + c.container_id, at)
            if cstalls:
                containers[c.container_id] = cstalls
                labels = (self.node_name, c.container_id, c.name, *base[1:])
                mine += _export(CONTAINER_PSI, labels, cstalls)

    def _unexport(self, now: dict[str, list[_Series]]) -> None:
        """Drop the series of pods (and containers) that were exported last round but not this one."""
        for uid, series in self._exported.items():
            keep = set(now.get(uid, ()))
            for gauge, labels in series:
                if (gauge, labels) not in keep:
                    try:
                        gauge.remove(*labels)
                    except KeyError:
                        pass
        self._exported = now


_Series = tuple[Gauge, tuple[str, ...]]


def _export(gauge: Gauge, base: tuple[str, ...], stalls: Stalls) -> list[_Series]:
    """Set koordlet's gauges of one pod or container; the series it set."""
    out = []
    for resource, stall in stalls.items():
        kind = RESOURCES[resource][1]
        lines = (("some", stall.pressure.some), ("full", stall.pressure.full))
        for degree, line in lines:
            if line is None:
                continue
            for precision, value in zip(PRECISIONS, (line.avg10, line.avg60, line.avg300), strict=True):
                labels = (*base, kind, precision, degree)
                gauge.labels(*labels).set(value)
                out.append((gauge, labels))
    return out
