"""MetricsCollector: every collect interval, sample the node, each known pod (and the containers a consumer
needs), and the BE aggregate; store the samples and publish one MetricTick.

Which containers' series are read is the `container_demand`'s answer per pod (`ContainerSeries`): the agent
asks for what its consumers read (`--container-metrics=needed`: today CPU usage and throttling of the pods CPU
burst acts on, nothing else); without a demand every container is read every round (koordlet's behaviour,
`--container-metrics=all`). A pod's own CPU, memory usage and memory.stat are always read.

Rates are counter deltas between rounds (docs/behaviour-qos-manager.md, "Metric definitions"): the first round
after start (or after a cgroup appears) has no delta and reports None for CPU usage and throttling. Missing
/proc files (synthetic roots) and vanished cgroups are logged once, counted, and leave the corresponding
values None.

NodeSLO host applications with a `cgroupPath` are measured like pods (CPU cores, memory working set) and
stored by app name; a cgroupPath that would leave the cgroup root is refused (logged once, counted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import structlog

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.parse import memory_figures_of, throttle_counts_of, usage_ns_of, working_set_of
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.errors import CgroupError, PathEscapeError, detached
from koordqos.events.types import MetricTick
from koordqos.metrics.hostapp import host_app_dir
from koordqos.metrics.podplan import ContainerPlan, PodPlan, numa_anon_of, pod_files, read_sets
from koordqos.metrics.procfs import (
    USER_HZ,
    CpuTicks,
    numa_memory_used,
    parse_cpu_busy,
    parse_meminfo,
    parse_node_meminfo,
    parse_proc_stat,
    read_text,
)
from koordqos.metrics.store import MetricStore
from koordqos.metrics.telemetry import HOST_APP_REFUSED, MISSING, ROUND_SECONDS
from koordqos.metrics.topology import CpuTopology
from koordqos.metrics.types import (
    BESample,
    ContainerSample,
    ContainerSeries,
    HostAppSample,
    MetricSnapshot,
    NodeSample,
    NumaSample,
    PodSample,
)
from koordqos.model.keys import BATCH_CPU
from koordqos.model.nodeslo import CgroupPath, HostApplicationSpec
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.metrics")

_NO_APPS: Mapping[str, HostAppSample] = MappingProxyType({})
# one synchronous slice of a round (reading and parsing pods) yields to the loop after this long
YIELD_AFTER_SECONDS = 0.002
INGEST_SLICE = 20  # pods handed to the store per call (~0.1 ms at load 0, ~1 ms on a loaded machine)
# plans of pods that left, dropped per loop step (closing a pod's ~6 files and one pass over the reader's
# dir memo: 1,000 pods gone at once, a drain, were ~50 ms in one step)
DROP_SLICE = 64

ContainerDemand = Callable[[PodInfo, NodeState], ContainerSeries]
"""Which container series of a pod some consumer reads. It may depend on the pod, the NodeSLO and static
configuration only: the collector asks again only when the pod's PodInfo or the NodeSLO object changes."""


class MetricsCollector:
    """The "metrics-collector" component (service "collector")."""

    name = "metrics-collector"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        layout: CgroupLayout,
        reader: CgroupReader,
        store: MetricStore,
        *,
        proc_root: Path | str = "/proc",
        sys_root: Path | str | None = None,
        topology: CpuTopology | None = None,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        read_in_thread: bool = False,
        container_demand: ContainerDemand | None = None,
    ) -> None:
        self.bus = bus
        self.layout = layout
        self.reader = reader
        self.store = store
        self.proc_root = Path(proc_root)
        self.topology = topology
        self.interval = interval
        self._clock = clock
        # read the pods' files in one worker-thread hop per round (parsing stays on the loop, in slices)
        self.read_in_thread = read_in_thread
        # which containers' series to read per pod; None: all of them (koordlet's behaviour)
        self.container_demand = container_demand
        self._v2 = layout.version is CgroupVersion.V2
        # NUMA nodes (sysfs `devices/system/node/node<N>`) and their CPUs: the per-NUMA usage of the
        # NodeMetric's numaUsages; none without a sys root or NUMA information
        self.sys_root = None if sys_root is None else Path(sys_root)
        self._numa_cpus = self._numa_nodes()
        self._multi_numa = len(self._numa_cpus) > 1
        self._prev_cpus: tuple[dict[int, int], float] | None = None
        self._prev: dict[str, tuple[int, float]] = {}  # counter key → (value, time)
        self._prev_thr: dict[str, tuple[int, int]] = {}  # throttle key → (nr_periods, nr_throttled)
        self._prev_node: tuple[CpuTicks, float] | None = None
        self._warned: SeenOnce[str] = SeenOnce()
        self._plans: dict[str, PodPlan] = {}
        # NodeState replaces its pods mapping on every change: per-mapping sums are kept until it does
        self._be_request_of: Mapping[str, PodInfo] | None = None
        self._round_of: Mapping[str, PodInfo] | None = None
        self._round_slo: object = None
        self._round_pods: list[PodInfo] = []
        self._round_plans: list[PodPlan] = []
        self._round_bad: list[PodInfo] = []
        self._be_request_total = 0
        # host app cgroupPath → its dir, or the error refusing it (checked once per distinct path)
        self._app_dirs: dict[tuple[str, str, str], str | CgroupError] = {}
        self._app_names: tuple[str, ...] = ()
        self.rounds = 0
        self.last: MetricSnapshot | None = None

    # -- component -----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Collect every `interval` seconds until cancelled; a failing round is logged and counted."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad round must not stop collection
                obs.ERRORS.labels("metrics-collector", type(exc).__name__).inc()
                error = f"{type(exc).__name__}: {exc}"
                # the same failure every second is logged once
                self._warn_once("round:" + error, "metrics round failed", error=error, exc_info=exc)
            next_at += self.interval
            now = loop.time()
            if next_at < now:  # fell behind: skip missed rounds instead of bursting
                next_at = now + self.interval
            await asyncio.sleep(next_at - now)

    async def round(self) -> MetricSnapshot:
        """One round: collect, store, drop deleted pods' series, publish a MetricTick."""
        snap = await self.collect()
        await asyncio.sleep(0)
        # the pods' samples go in slices (1,000 pods: ~8,000 samples, several ms in one call otherwise)
        items = list(snap.pods.items())
        since = time.perf_counter()
        for start in range(0, len(items), INGEST_SLICE):
            if time.perf_counter() - since >= YIELD_AFTER_SECONDS:
                await asyncio.sleep(0)
                since = time.perf_counter()
            self.store.ingest_pods(snap.at, items[start : start + INGEST_SLICE])
        await asyncio.sleep(0)
        self.store.ingest_node(snap)
        gone = self.store.retain_pods(snap.pods.keys())
        if gone:
            self._round_of = None  # the round's plan list may hold the closed files
            await self._drop_plans(gone)
        self.store.retain_host_apps(self._app_names)
        self.last = snap
        self.rounds += 1
        await self.bus.publish(MetricTick(at=snap.at, sample=snap))
        return snap

    # -- collection ----------------------------------------------------------------------------------------

    async def collect(self) -> MetricSnapshot:
        """Sample everything once (yields to the loop whenever a slice of pods ran YIELD_AFTER_SECONDS)."""
        cpu0 = time.process_time()
        at = self._clock()
        node = self._node(at)
        state = self.bus.state
        out: dict[str, PodSample] = {}
        seen: set[str] = set()
        since = time.perf_counter()
        spent = 0.0
        slo = state.node_slo if self.container_demand is not None else None
        # the pods and their plans, again only when the pods (or, with a demand, the NodeSLO) changed
        if self._round_of is not state.pods or self._round_slo is not slo:
            pods = [p for p in state.pods.values() if not p.terminated]
            plans, bad = [], []
            for pod in pods:
                plan = self._plan(pod, state, slo)
                if plan is None:
                    bad.append(pod)
                else:
                    plans.append(plan)
            self._round_pods, self._round_plans, self._round_bad = pods, plans, bad
            self._round_of, self._round_slo = state.pods, slo
            # a pod that never gave a sample never leaves the store: its plan goes when it leaves the plans
            if len(self._plans) > len(plans):
                planned = {plan.pod.uid for plan in plans}
                await self._drop_plans([u for u in self._plans if u not in planned])
        else:
            for pod in self._round_bad:  # refused pods are counted every round, as before
                self._plan(pod, state, slo)
        pods, plans = self._round_pods, self._round_plans
        read: list[tuple[float, list[bytes | None]]] | None = None
        spent += time.process_time() - cpu0
        if self.read_in_thread and plans:
            read = await asyncio.to_thread(read_sets, self._clock, plans)
        else:  # what ran before (the caller's tail, /proc, the plans) is one slice; the pods start afresh
            await asyncio.sleep(0)
        cpu0 = time.process_time()
        since = time.perf_counter()
        clock = self._clock
        for i, plan in enumerate(plans):
            if time.perf_counter() - since >= YIELD_AFTER_SECONDS:
                spent += time.process_time() - cpu0
                await asyncio.sleep(0)
                cpu0 = time.process_time()
                since = time.perf_counter()
            if read is not None:
                t, data = read[i]
            else:
                t = clock()
                data = plan.files.read()
            sample = self._pod(plan, t, data, seen)
            if sample is not None:
                out[plan.pod.uid] = sample
        spent += time.process_time() - cpu0
        await asyncio.sleep(0)  # the pods and the rest of the round are separate slices
        cpu0 = time.process_time()
        be = self._be(state.pods, pods, seen, node)
        apps = self._host_apps(state.node_slo.host_applications if state.node_slo is not None else (), seen)
        for key in [k for k in self._prev if k not in seen]:
            del self._prev[key]
        for key in [k for k in self._prev_thr if k not in seen]:
            del self._prev_thr[key]
        spent += time.process_time() - cpu0
        ROUND_SECONDS.observe(spent)
        return MetricSnapshot(
            at=at, interval=self.interval, node=node, pods=MappingProxyType(out), be=be, host_apps=apps
        )

    def _warn_once(self, key: str, msg: str, **kw: object) -> None:
        if self._warned.first(key):
            log.warning(msg, **kw)

    def _missing(self, source: str, key: str, msg: str, **kw: object) -> None:
        MISSING.labels(source).inc()
        self._warn_once(key, msg, **kw)

    def _numa_nodes(self) -> dict[int, tuple[int, ...]]:
        if self.sys_root is None or self.topology is None:
            return {}
        base = self.sys_root / "devices/system/node"
        by_node = self.topology.by_node()
        return {n: cpus for n, cpus in by_node.items() if (base / f"node{n}" / "meminfo").exists()}

    def _numa(self, text: str | None, at: float) -> tuple[NumaSample, ...]:
        """Per NUMA node: Σ busy-tick deltas of its CPUs / (Δt · USER_HZ), and its meminfo's usage."""
        if not self._numa_cpus or self.sys_root is None:
            return ()
        busy = parse_cpu_busy(text) if text is not None else {}
        prev = self._prev_cpus
        self._prev_cpus = (busy, at) if busy else None
        out: list[NumaSample] = []
        base = self.sys_root / "devices/system/node"
        for node, cpus in self._numa_cpus.items():
            cores: float | None = None
            if prev is not None and at > prev[1] and all(c in busy and c in prev[0] for c in cpus):
                delta = sum(busy[c] - prev[0][c] for c in cpus)
                if delta >= 0:
                    cores = delta / ((at - prev[1]) * USER_HZ)
            mem_text = read_text(base / f"node{node}" / "meminfo")
            used = numa_memory_used(parse_node_meminfo(mem_text)) if mem_text is not None else None
            if used is None:
                self._missing(
                    "numa_meminfo", f"numa:{node}", "cannot read NUMA node memory", node=node, dir=str(base)
                )
            out.append(NumaSample(node, cores, used))
        return tuple(out)

    def _node(self, at: float) -> NodeSample:
        cpu_cores: float | None = None
        online = len(self.topology) if self.topology is not None else 0
        text = read_text(self.proc_root / "stat")
        ticks = parse_proc_stat(text) if text is not None else None
        if ticks is None:
            self._missing(
                "proc_stat", "proc_stat", "cannot read node CPU ticks", path=str(self.proc_root / "stat")
            )
        else:
            online = online or ticks.online_cpus
            prev = self._prev_node
            if prev is not None and at > prev[1] and ticks.busy >= prev[0].busy:
                cpu_cores = (ticks.busy - prev[0].busy) / ((at - prev[1]) * USER_HZ)
            self._prev_node = (ticks, at)
        mem_text = read_text(self.proc_root / "meminfo")
        mem = parse_meminfo(mem_text) if mem_text is not None else {}
        total, avail, free = mem.get("MemTotal"), mem.get("MemAvailable"), mem.get("MemFree")
        if total is None or avail is None:
            self._missing(
                "proc_meminfo",
                "proc_meminfo",
                "cannot read node memory",
                path=str(self.proc_root / "meminfo"),
            )
        return NodeSample(
            cpu_usage_cores=cpu_cores,
            memory_total=total,
            memory_available=avail,
            memory_free=free,
            memory_used=None if total is None or avail is None else max(0, total - avail),
            memory_used_with_cache=None if total is None or free is None else max(0, total - free),
            cpu_count=online,
            numa=self._numa(text, at),
        )

    def _rate(self, key: str, value: int | None, at: float, seen: set[str]) -> float | None:
        """Δvalue / Δt for a cumulative counter; None on the first sample or a counter reset."""
        if value is None:
            return None
        seen.add(key)
        prev = self._prev.get(key)
        self._prev[key] = (value, at)
        if prev is None or at <= prev[1] or value < prev[0]:
            return None
        return (value - prev[0]) / (at - prev[1])

    def _cpu_cores(self, rel: str, key: str, at: float, seen: set[str]) -> float | None:
        rate = self._rate(key, self.reader.cpu_usage_ns(rel), at, seen)
        return None if rate is None else rate / 1e9

    def _throttle_ratio(self, key: str, counts: tuple[int, int] | None, seen: set[str]) -> float | None:
        """Δnr_throttled / Δnr_periods since the last round (counts: (nr_periods, nr_throttled)); None on the
        first sample or a reset."""
        if counts is None:
            return None
        seen.add(key)
        prev = self._prev_thr.get(key)
        self._prev_thr[key] = counts
        nr_periods, nr_throttled = counts
        if prev is None or nr_periods < prev[0] or nr_throttled < prev[1]:
            return None
        periods = nr_periods - prev[0]
        return 0.0 if periods == 0 else (nr_throttled - prev[1]) / periods

    def _plan(self, pod: PodInfo, state: NodeState, slo: object) -> PodPlan | None:
        """The pod's cgroup dirs, counter keys and open files, built once per PodInfo (and NodeSLO, with a
        demand: path building and opening are not free); a new plan with the same files keeps them open."""
        plan = self._plans.get(pod.uid)
        if plan is not None and plan.pod is pod and plan.slo is slo:
            return plan
        try:
            pod_dir = self.layout.pod_dir(pod)
        except CgroupError as exc:
            self._missing(
                "bad_pod", "uid:" + pod.uid, "pod not measured", pod=pod.key, uid=pod.uid, error=str(exc)
            )
            return None
        demand = self.container_demand
        series = ContainerSeries.ALL if demand is None else demand(pod, state)
        containers: list[ContainerPlan] = []
        measured = (*pod.containers, *(i for i in pod.init_containers if i.sidecar)) if series else ()
        for c in measured:
            if not c.container_id:
                continue
            try:
                cdir = self.layout.container_dir_in(pod_dir, c.container_id)
            except CgroupError as exc:
                self._missing(
                    "bad_container_id",
                    "cid:" + c.container_id,
                    "container not measured",
                    pod=pod.key,
                    container=c.name,
                    error=str(exc),
                )
                continue
            containers.append(ContainerPlan(c.container_id, c.name, cdir, "cpu:" + cdir, "thr:" + cdir))
        entries = pod_files(self._v2, pod_dir, [c.dir for c in containers], series, self._multi_numa)
        if plan is not None and plan.files.entries == tuple(entries):
            files = plan.files
        else:
            if plan is not None:
                plan.files.close()
            files = self.reader.file_set(entries)
        plan = PodPlan(
            pod,
            pod_dir,
            "cpu:" + pod_dir,
            tuple(containers),
            files,
            series,
            slo,
            ContainerSeries.CPU in series,
            ContainerSeries.MEMORY in series,
            self._multi_numa,
        )
        self._plans[pod.uid] = plan
        return plan

    def _pod(self, plan: PodPlan, at: float, data: list[bytes | None], seen: set[str]) -> PodSample | None:
        """A pod's sample from its files' contents (see PodPlan for their order)."""
        v2 = self._v2
        rate = self._rate
        cpu_ns = rate(plan.cpu_key, usage_ns_of(data[0], v2), at, seen)
        cpu = None if cpu_ns is None else cpu_ns / 1e9
        figures = memory_figures_of(data[1], data[2], v2)  # working set, anon, anon + file pages
        if figures is None and cpu is None and plan.cpu_key not in seen:
            pod = plan.pod
            self._missing(
                "cgroup_vanished", "pod:" + pod.uid, "pod cgroup missing", pod=pod.key, dir=plan.dir
            )
            return None
        containers: tuple[ContainerSample, ...] = ()
        if plan.containers:
            containers = self._containers(plan, at, data, seen)
        uid = plan.pod.uid
        numa = numa_anon_of(data[3], v2) if plan.numa else None
        if figures is None:
            return PodSample(uid, cpu, None, containers, numa_memory=numa)
        return PodSample(uid, cpu, figures[0], containers, figures[1], figures[2], numa)

    def _containers(
        self, plan: PodPlan, at: float, data: list[bytes | None], seen: set[str]
    ) -> tuple[ContainerSample, ...]:
        """The containers' samples (their files follow the pod's three; see PodPlan for the order)."""
        v2 = self._v2
        read_cpu, read_memory = plan.read_cpu, plan.read_memory
        i = 4 if plan.numa else 3
        out = []
        for c in plan.containers:
            cpu = throttled = None
            if read_cpu:
                cpu_data = data[i]
                c_ns = self._rate(c.cpu_key, usage_ns_of(cpu_data, v2), at, seen)
                cpu = None if c_ns is None else c_ns / 1e9
                if not v2:
                    i += 1
                throttled = self._throttle_ratio(c.thr_key, throttle_counts_of(data[i]), seen)
                i += 1
            working_set = None
            if read_memory:
                working_set = working_set_of(data[i], data[i + 1], v2)
                i += 2
            out.append(ContainerSample(c.id, c.name, cpu, working_set, throttled))
        return tuple(out)

    def _be_request(self, mapping: Mapping[str, PodInfo], pods: list[PodInfo]) -> int:
        """Σ batch-cpu requests of the BE pods, summed again only when the pods mapping changed."""
        if self._be_request_of is not mapping:
            request = 0
            for pod in pods:
                if pod.qos is QoSClass.BE:
                    request += pod.request(BATCH_CPU)  # containers + native sidecars, negatives as 0
            self._be_request_of, self._be_request_total = mapping, request
        return self._be_request_total

    def _be(
        self, mapping: Mapping[str, PodInfo], pods: list[PodInfo], seen: set[str], node: NodeSample
    ) -> BESample:
        be_dir = self.layout.qos_dir(KubeQoS.BESTEFFORT)
        at = self._clock()
        rate = self._rate("cpu:" + be_dir, self.reader.cpu_usage_ns(be_dir), at, seen)
        usage = None if rate is None else int(rate / 1e6)  # ns/s → milli-cores
        request = self._be_request(mapping, pods)
        cpuset = self.reader.cpuset(be_dir) or frozenset()
        qp = self.reader.cpu_quota_period(be_dir)
        cpus = len(cpuset) if cpuset else node.cpu_count
        real: int | None = cpus * 1000 if cpus else None
        quota = period = None
        if qp is not None:
            quota, period = qp
            if quota > 0 and period > 0:
                by_quota = quota * 1000 // period
                real = by_quota if real is None else min(real, by_quota)
        return BESample(usage, request, real, cpuset, quota, period)

    def _app_dir(self, path: CgroupPath) -> str | CgroupError:
        """The host app's checked dir, or why it was refused (memoised per distinct cgroupPath)."""
        key = (path.base, path.parent_dir, path.relative_path)
        found = self._app_dirs.get(key)
        if found is None:
            try:
                found = host_app_dir(self.layout, path)
            except CgroupError as exc:
                found = detached(exc)  # kept: without the frames that raised it
            if len(self._app_dirs) > 1024:  # NodeSLO edits come and go
                self._app_dirs.clear()
            self._app_dirs[key] = found
        return found

    def _host_apps(
        self, apps: tuple[HostApplicationSpec, ...], seen: set[str]
    ) -> Mapping[str, HostAppSample]:
        """CPU cores and memory working set of each NodeSLO host application with a cgroupPath."""
        self._app_names = tuple(a.name for a in apps)
        if not apps:
            return _NO_APPS
        out: dict[str, HostAppSample] = {}
        at = self._clock()
        for app in apps:
            if app.name in out:
                self._warn_once(
                    "app-dup:" + app.name, "duplicate host application name; first kept", app=app.name
                )
                continue
            if app.cgroup_path is None:
                self._warn_once(
                    "app-nopath:" + app.name, "host application has no cgroupPath; not measured", app=app.name
                )
                continue
            rel = self._app_dir(app.cgroup_path)
            if isinstance(rel, CgroupError):
                reason = "escape" if isinstance(rel, PathEscapeError) else "invalid"
                HOST_APP_REFUSED.labels(reason).inc()
                self._warn_once(
                    f"app-refused:{app.name}:{app.cgroup_path!r}",
                    "host application cgroupPath refused; not measured",
                    app=app.name,
                    base=app.cgroup_path.base,
                    parent_dir=app.cgroup_path.parent_dir,
                    relative_path=app.cgroup_path.relative_path,
                    error=str(rel),
                )
                continue
            # own counter key: an app may share its dir with a pod, the BE dir or another app
            key = f"app:{app.name}:{rel}"
            cpu = self._cpu_cores(rel, key, at, seen)
            readings = self.reader.memory_readings(rel)
            mem = None if readings is None else readings.working_set
            if cpu is None and mem is None and key not in seen:
                self._missing(
                    "host_app_cgroup",
                    "app:" + app.name,
                    "host application cgroup missing",
                    app=app.name,
                    dir=rel,
                )
                continue
            anon = None if readings is None else readings.anon
            with_cache = None if readings is None else readings.with_cache
            out[app.name] = HostAppSample(app.name, rel, cpu, mem, anon, with_cache)
        return MappingProxyType(out)

    async def _drop_plans(self, uids: Sequence[str]) -> None:
        """Close the plans of pods that left and forget their dirs, DROP_SLICE pods per loop step."""
        for start in range(0, len(uids), DROP_SLICE):
            if start:
                await asyncio.sleep(0)
            dirs = []
            for uid in uids[start : start + DROP_SLICE]:
                self._warned.discard("pod:" + uid)
                plan = self._plans.pop(uid, None)
                if plan is not None:
                    plan.files.close()
                    dirs.append(plan.dir)
            self.reader.forget(*dirs)

    def close(self) -> None:
        """Close every pod's open files."""
        for plan in self._plans.values():
            plan.files.close()
        self._plans.clear()
