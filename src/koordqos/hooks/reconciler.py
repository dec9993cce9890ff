"""Reconciler: keep pod, container and kube-QoS settings true (runtime-hooks.md §1.6).

Runs every `hooks.reconcile_interval_seconds` and soon after pod, Node or NodeSLO changes (changes are
coalesced: one pass covers all that arrived meanwhile). Each pass builds the contexts from NodeState,
runs the applicable reconcile functions, and applies the intents through the cgroup executor as one
leveled, cacheable batch, so unchanged values are not rewritten and settings missed while the agent or
the runtime was down converge. Pods in phase Succeeded/Failed are skipped (project decision §8.6).

NodeSLO host applications (§1.7, §2.5) are reconciled in the same pass: bvt and cpuset at the app's
cgroup dir. Since rules are re-parsed at the start of every pass, a GroupIdentity or CPUSetAllocator
rule change rewrites the host apps in the pass that sees it (the rule callbacks' host-app step).

Pods are taken from the API server view (PodInfo) and, for pods known only through NRI (local mode),
from the runtime's sandboxes and containers; both go through the same code.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import Counter, Histogram

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level
from koordqos.cgroups.layout import RUNTIME_SCOPE_PREFIX, CgroupLayout
from koordqos.decisions import DecisionLog
from koordqos.errors import CgroupError
from koordqos.events.bus import EventBus
from koordqos.events.types import (
    Event,
    NodeSLOUpdated,
    NodeUpdated,
    PodsReplaced,
    PodUpserted,
    RuntimeContainer,
    RuntimeContainerUpserted,
    RuntimeSandbox,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
)
from koordqos.hooks.completion import container_writes, host_app_writes, kube_qos_writes, pod_writes
from koordqos.hooks.context import (
    ContainerContext,
    ContainerRequest,
    HostAppContext,
    HostAppRequest,
    KubeQoSContext,
    PodContext,
    PodRequest,
    container_context_from_pod,
    pod_context_from_pod,
    pod_extended,
    qos_from_name,
)
from koordqos.hooks.resources import ExtendedResourceSpecError, extended_from_annotation
from koordqos.hooks.runtime import RuntimeHooks, pod_qos_condition
from koordqos.metrics.hostapp import host_app_dir
from koordqos.model.keys import ANNOTATION_DOCKER_TYPE
from koordqos.model.nodeslo import CgroupPath, HostApplicationSpec
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.hooks.reconciler")

STRATEGY = "runtime-hooks"

RECONCILE_PASSES = Counter(
    "koordqos_hooks_reconcile_passes_total",
    "Reconciler passes by trigger",
    ["trigger"],
    registry=obs.REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "koordqos_hooks_reconcile_errors_total",
    "Reconcile functions that failed, by level",
    ["level"],
    registry=obs.REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "koordqos_hooks_reconcile_seconds",
    "Duration of one reconciler pass (compute + apply)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    registry=obs.REGISTRY,
)

TRIGGERS: tuple[type[Event], ...] = (
    PodUpserted,
    PodsReplaced,
    NodeUpdated,
    NodeSLOUpdated,
    RuntimeSandboxUpserted,
    RuntimeContainerUpserted,
    RuntimeSynchronized,
)


@dataclass
class PassResult:
    """What one pass computed (tests and /debug read it)."""

    writes: list[CgroupWrite] = field(default_factory=list)
    oom: list[tuple[str, int]] = field(default_factory=list)  # (container dir, value)
    cookies: list[tuple[str, str, str, bool, str]] = field(default_factory=list)
    containers: set[str] = field(default_factory=set)  # "<pod uid>/<container id>" seen this pass
    errors: dict[str, str] = field(default_factory=dict)
    rules_updated: set[str] = field(default_factory=set)
    host_apps: dict[str, str] = field(default_factory=dict)  # host application name → its cgroup dir


@dataclass(frozen=True, slots=True)
class _PodView:
    uid: str
    pod: PodInfo | None
    sandbox: RuntimeSandbox | None
    containers: tuple[RuntimeContainer, ...]


def _pod_views(state: NodeState) -> Iterator[_PodView]:
    by_uid: dict[str, RuntimeSandbox] = {}
    for sb in state.sandboxes.values():
        by_uid[sb.uid] = sb
    ctrs: dict[str, list[RuntimeContainer]] = {}
    for c in state.containers.values():
        ctrs.setdefault(c.pod_uid, []).append(c)
    for uid, pod in state.pods.items():
        yield _PodView(uid, pod, by_uid.pop(uid, None), tuple(ctrs.get(uid, ())))
    for uid, sb in by_uid.items():
        yield _PodView(uid, None, sb, tuple(ctrs.get(uid, ())))


YIELD_EVERY_PODS = 20
MAX_WARNED = 4096  # log-once memories; beyond this they are forgotten all at once (bounded memory)
DEFAULT_RUNTIME = "containerd"
_RUNTIME_OF_SCOPE = {prefix: runtime for runtime, prefix in RUNTIME_SCOPE_PREFIX.items()}


def sandbox_runtime(
    pod: PodInfo | None, annotations: Mapping[str, str], containers: Sequence[RuntimeContainer]
) -> str:
    """Runtime for the sandbox id (§2.3): that of the pod's first container, else containerd.

    The first container status with a known `<runtime>://` prefix decides (containers, then init
    containers); for pods known only through NRI, a systemd cgroups path ("slice:<scope prefix>:id")
    or the docker annotation tells; containerd only when nothing does.
    """
    if pod is not None:
        for c in (*pod.containers, *pod.init_containers):
            if c.runtime in RUNTIME_SCOPE_PREFIX:
                return c.runtime
    for rc in containers:
        parts = rc.cgroups_path.split(":")
        if len(parts) == 3 and parts[1] in _RUNTIME_OF_SCOPE:
            return _RUNTIME_OF_SCOPE[parts[1]]
    if ANNOTATION_DOCKER_TYPE in annotations:
        return "docker"
    return DEFAULT_RUNTIME


class HookReconciler:
    """Computes and applies the reconcile intents; a Component when run with a bus."""

    name = "hooks-reconciler"
    essential = False

    def __init__(
        self,
        hooks: RuntimeHooks,
        layout: CgroupLayout,
        executor: CgroupExecutor,
        decisions: DecisionLog,
        *,
        bus: EventBus | None = None,
        interval: float = 10.0,
        proc_root: Path | str = "/proc",
        settle: float = 0.5,
    ) -> None:
        self.hooks = hooks
        self.layout = layout
        self.executor = executor
        self.decisions = decisions
        self.bus = bus
        self.interval = interval
        self.settle = settle
        self.proc_root = Path(proc_root)
        self._wake = asyncio.Event()
        self._trigger = "start"
        self.passes = 0
        self.last: PassResult | None = None
        self._warned: SeenOnce[tuple[str, str]] = SeenOnce(MAX_WARNED)  # (pod uid, error) already logged
        self._apps_warned: SeenOnce[tuple[str, str]] = SeenOnce(MAX_WARNED)  # (host app, error) logged
        self._pass_errors_logged: SeenOnce[str] = SeenOnce(MAX_WARNED)  # pass failure texts logged
        if bus is not None:
            bus.subscribe(self.name, self._on_event, *TRIGGERS)

    # -- component --------------------------------------------------------------------------------

    def _on_event(self, event: Event, state: NodeState) -> None:
        self._trigger = type(event).__name__
        self._wake.set()

    async def run(self) -> None:
        """Pass at start, then every interval and after changes."""
        assert self.bus is not None
        while True:
            trigger = self._trigger
            self._wake.clear()
            try:
                await self.reconcile(self.bus.state, trigger)
            except Exception as exc:  # one bad pass must not stop the loop
                self._pass_failed(exc)
            self._trigger = "interval"
            # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a cancellation that races a wakeup
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            else:
                # woken by a change: let a burst of changes (a Synchronize, a re-list, a batch of container
                # creations) settle into one pass instead of one full pass per event
                await asyncio.sleep(min(self.settle, self.interval))

    def _pass_failed(self, exc: Exception) -> None:
        """Count every failed pass; log (with traceback) each distinct error text once."""
        obs.ERRORS.labels("hooks-reconciler", "pass").inc()
        text = f"{type(exc).__name__}: {exc}"
        if self._pass_errors_logged.first(text):
            log.error("reconcile pass failed", error=text, exc_info=exc)

    # -- one pass ---------------------------------------------------------------------------------

    async def reconcile(self, state: NodeState, trigger: str = "manual") -> PassResult:
        """Compute every intent from `state` and apply it."""
        start = time.perf_counter()
        result = PassResult()
        for done, _ in enumerate(self._compute_steps(state, result), 1):
            if done % YIELD_EVERY_PODS == 0:
                await asyncio.sleep(0)  # keep every step on the loop short at hundreds of pods
        RECONCILE_PASSES.labels(trigger).inc()
        if "GroupIdentity" in result.rules_updated:
            self._init_group_identity_sysctl()
        if result.writes:
            await self.executor.apply(STRATEGY, result.writes, reason=f"reconcile ({trigger})")
        if result.oom:
            await asyncio.to_thread(self._apply_oom, result.oom)
        cs = self.hooks.core_sched
        if cs is not None and cs.cookies is not None:
            # also with no plans: containers that went away must leave the cookie caches
            await asyncio.to_thread(self._apply_cookies, result.cookies, result.containers)
        self.passes += 1
        self.last = result
        RECONCILE_SECONDS.observe(time.perf_counter() - start)
        return result

    def compute(self, state: NodeState) -> PassResult:
        """The intents of one pass (pure apart from listing dangling pod dirs after a bvt rule change)."""
        result = PassResult()
        for _ in self._compute_steps(state, result):
            pass
        return result

    def _compute_steps(self, state: NodeState, result: PassResult) -> Iterator[None]:
        """Fill `result` with the pass's intents, yielding after each pod so callers can pace the work."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        result.rules_updated = self.hooks.take_updates()
        for kube_qos in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT):
            kctx = KubeQoSContext(kube_qos, self.layout.qos_dir(kube_qos))
            self._errors(result, "kubeqos", self.hooks.reconcile_kube_qos(kctx))
            result.writes += kube_qos_writes(kctx)
        bvt_changed = "GroupIdentity" in result.rules_updated
        known_pod_dirs: set[str] = set()
        uids: set[str] = set()
        for view in _pod_views(state):
            uids.add(view.uid)
            if view.pod is not None and view.pod.terminated:
                continue
            try:
                self._pod(view, result, known_pod_dirs, bvt_changed)
            except (CgroupError, ExtendedResourceSpecError, ValueError) as exc:
                self._bad_pod(view.uid, exc, result)
            yield
        if bvt_changed:
            result.writes += self._dangling_bvt(known_pod_dirs)
        self._host_apps(state.node_slo.host_applications if state.node_slo is not None else (), result)
        # pods that left the node: their errors may be logged again if they ever come back
        self._warned.retain(lambda k: k[0] in uids)

    def _bad_pod(self, uid: str, exc: Exception, result: PassResult) -> None:
        result.errors[f"pod/{uid}"] = str(exc)
        RECONCILE_ERRORS.labels("pod").inc()
        key = (uid, str(exc))
        if self._warned.first(key):
            obs.ERRORS.labels("hooks-reconciler", "bad_pod").inc()
            log.warning("pod skipped by the hooks reconciler", pod_uid=uid, error=str(exc))

    # -- host applications (§1.7) -----------------------------------------------------------------

    def _host_apps(self, apps: Sequence[HostApplicationSpec], result: PassResult) -> None:
        """Bvt and cpuset of every NodeSLO host application; a refused app is skipped, the rest go on."""
        names: set[str] = set()
        for app in apps:
            if app.name in names:
                # the first one wins, as for the host-app usage metrics
                self._bad_app(app.name, "", "duplicate host application name; first kept", result)
                continue
            names.add(app.name)
            try:
                ctx = host_app_context(self.layout, app)
            except CgroupError as exc:  # PathEscapeError (counted by the layout) included
                self._bad_app(app.name, "", f"cgroup dir refused: {exc}", result)
                continue
            result.host_apps[app.name] = ctx.request.cgroup_parent
            for key, error in self.hooks.reconcile_host_app(ctx).items():
                self._bad_app(app.name, key, error, result)
            result.writes += host_app_writes(ctx)
        self._apps_warned.retain(lambda k: k[0] in names)

    def _bad_app(self, name: str, hook: str, error: str, result: PassResult) -> None:
        """Count every time; log each distinct (app, error) once while the app stays in the NodeSLO."""
        RECONCILE_ERRORS.labels("hostapp").inc()
        result.errors["/".join(p for p in ("hostapp", name, hook) if p)] = error
        key = (name, f"{hook}: {error}" if hook else error)
        if self._apps_warned.first(key):
            log.warning("host application not fully reconciled", host_app=name, hook=hook, error=error)

    def _errors(self, result: PassResult, level: str, errors: Mapping[str, str]) -> None:
        for k, v in errors.items():
            RECONCILE_ERRORS.labels(level).inc()
            result.errors[f"{level}/{k}"] = v

    def _pod(self, view: _PodView, result: PassResult, known: set[str], bvt_changed: bool) -> None:
        pod, sb = view.pod, view.sandbox
        if pod is not None:
            pod_dir = self.layout.pod_dir(pod)
            pctx = pod_context_from_pod(pod, pod_dir)
            extended = pctx.request.extended
        else:
            assert sb is not None
            pod_dir = self.layout.normalize_parent(sb.cgroup_parent) if sb.cgroup_parent else ""
            extended = extended_from_annotation(sb.annotations)
            pctx = PodContext(
                PodRequest(
                    uid=sb.uid,
                    namespace=sb.namespace,
                    name=sb.name,
                    labels=sb.labels,
                    annotations=sb.annotations,
                    cgroup_parent=pod_dir,
                    extended=extended,
                )
            )
        known.add(pod_dir)
        self._errors(result, "pod", self.hooks.reconcile_pod(pctx))
        writes = pod_writes(pctx)
        result.writes += writes
        bvt = pctx.response.resources.cpu_bvt
        for cctx in self._container_contexts(view, pod_dir, extended):
            result.containers.add(f"{cctx.request.pod_uid}/{cctx.request.container_id}")
            self._errors(result, "container", self.hooks.reconcile_container(cctx))
            result.writes += container_writes(cctx)
            if bvt_changed and bvt is not None and cctx.request.cgroup_parent:
                # the GroupIdentity rule callback rewrites container dirs explicitly
                result.writes.append(
                    CgroupWrite(cctx.request.cgroup_parent, "cpu.bvt_warp_ns", bvt, Level.CONTAINER)
                )
            self._virtual(cctx, result)

    def _container_contexts(self, view: _PodView, pod_dir: str, extended: Any) -> Iterator[ContainerContext]:
        pod, sb = view.pod, view.sandbox
        labels = pod.labels if pod is not None else sb.labels if sb is not None else {}
        annotations = pod.annotations if pod is not None else sb.annotations if sb is not None else {}
        seen: set[str] = set()
        runtime = sandbox_runtime(pod, annotations, view.containers)
        if pod is not None:
            for c in (*pod.init_containers, *pod.containers):
                if not c.container_id or c.state == "terminated":
                    continue
                seen.add(c.runtime_id)
                cdir = self.layout.container_dir_in(pod_dir, c.container_id)
                yield container_context_from_pod(pod, c, pod_dir, cdir, extended)
        if sb is not None and sb.id and pod_dir:
            sandbox_id = f"{runtime}://{sb.id}"
            yield ContainerContext(
                ContainerRequest(
                    pod_uid=view.uid,
                    container_id=sandbox_id,
                    sandbox=True,
                    pod_namespace=sb.namespace,
                    pod_name=sb.name,
                    pod_labels=labels,
                    pod_annotations=annotations,
                    pod_cgroup_parent=pod_dir,
                    cgroup_parent=self.layout.container_dir_in(pod_dir, sandbox_id),
                )
            )
        for rc in view.containers:
            if rc.id in seen or rc.state in ("stopped",):
                continue
            cdir = self.layout.normalize_parent(rc.cgroups_path) if rc.cgroups_path else ""
            ext = extended.containers.get(rc.name) if extended is not None else None
            yield ContainerContext(
                ContainerRequest(
                    pod_uid=view.uid,
                    container_name=rc.name,
                    container_id=f"{runtime}://{rc.id}",
                    pod_namespace=sb.namespace if sb is not None else "",
                    pod_name=sb.name if sb is not None else "",
                    pod_labels=labels,
                    pod_annotations=annotations,
                    pod_cgroup_parent=pod_dir,
                    cgroup_parent=cdir,
                    extended=ext,
                )
            )

    def _virtual(self, cctx: ContainerContext, result: PassResult) -> None:
        oom = self.hooks.oom
        if oom is not None and cctx.request.cgroup_parent:
            value = oom.target(cctx)
            if value is not None:
                result.oom.append((cctx.request.cgroup_parent, value))
        cs = self.hooks.core_sched
        if cs is not None and cctx.request.qos is not QoSClass.SYSTEM and cctx.request.cgroup_parent:
            try:
                plan = cs.container_plan(cctx)
            except ValueError as exc:
                result.errors[f"coresched/{cctx.request.cgroup_parent}"] = str(exc)
                return
            if plan is not None:
                r = cctx.request
                result.cookies.append((r.cgroup_parent, r.pod_uid, r.container_id, plan[0], plan[1]))

    def _dangling_bvt(self, known: set[str]) -> list[CgroupWrite]:
        """Pod dirs on disk that no known pod owns get their QoS dir's bvt (pod and container dirs)."""
        gi = self.hooks.group_identity
        if gi is None:
            return []
        rule = gi.prepare()
        if rule is None:
            return []
        writes: list[CgroupWrite] = []
        qos_dirs = set(self.layout.qos_dirs())
        for kube_qos in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT):
            qdir = self.layout.qos_dir(kube_qos)
            value = rule.dir_value(kube_qos)
            for child in _subdirs(self.layout, qdir):
                rel = f"{qdir}/{child}"
                if rel in qos_dirs or rel in known or "pod" not in child:
                    continue
                writes.append(CgroupWrite(rel, "cpu.bvt_warp_ns", value, Level.POD))
                for sub in _subdirs(self.layout, rel):
                    writes.append(CgroupWrite(f"{rel}/{sub}", "cpu.bvt_warp_ns", value, Level.CONTAINER))
        return writes

    def _init_group_identity_sysctl(self) -> None:
        """Rule enabled: turn core scheduling off and group identity on, where those sysctls exist."""
        gi = self.hooks.group_identity
        if gi is None or gi.rule is None or not gi.rule.enable:
            return
        kernel = self.proc_root / "sys/kernel"
        for name, value in (("sched_core", "0"), ("sched_group_identity_enabled", "1")):
            path = kernel / name
            try:
                current = path.read_text().strip()
            except OSError:
                continue  # absent on this kernel
            if current == value:
                continue
            if not self.decisions.dry_run:
                try:
                    path.write_text(value)
                except OSError as exc:
                    obs.ERRORS.labels("hooks-reconciler", "sysctl").inc()
                    log.warning("sysctl write failed", sysctl=name, value=value, error=str(exc))
                    continue
            self.decisions.record(STRATEGY, f"sysctl/kernel/{name}", "write", current, value, "GroupIdentity")

    # -- oom_score_adj (per process) --------------------------------------------------------------

    def _apply_oom(self, targets: Sequence[tuple[str, int]]) -> None:
        for cdir, value in targets:
            try:
                procs = _read_procs(self.layout, cdir)
            except (OSError, CgroupError):
                continue
            updated, skipped = set_oom_score_adj(self.proc_root, procs, value, self.decisions)
            if updated:
                log.debug("oom_score_adj set", cgroup=cdir, value=value, updated=updated, skipped=skipped)

    def _apply_cookies(self, plans: Sequence[tuple[str, str, str, bool, str]], live: Collection[str]) -> None:
        cs = self.hooks.core_sched
        if cs is None or cs.cookies is None:
            return
        cs.cookies.prune(live, self.proc_root)
        for cdir, uid, cid, enabled, group in plans:
            try:
                pids = _read_procs(self.layout, cdir)
            except (OSError, CgroupError):
                continue
            if self.decisions.dry_run:
                self.decisions.record(
                    STRATEGY,
                    cdir,
                    "core-sched-enable" if enabled else "core-sched-disable",
                    None,
                    group,
                    "CoreSched",
                    dry_run=True,
                )
            elif enabled:
                cs.cookies.enable(uid, cid, group, pids)
            else:
                cs.cookies.disable(uid, cid, pids)


def host_app_cgroup_path(app: HostApplicationSpec) -> CgroupPath:
    """The app's cgroupPath, or the default one (§2.5): host-latency-sensitive / host-best-effort / root."""
    if app.cgroup_path is not None:
        return app.cgroup_path
    qos = qos_from_name(app.qos)
    if qos in (QoSClass.LSE, QoSClass.LSR, QoSClass.LS):
        parent = "host-latency-sensitive"
    elif qos is QoSClass.BE:
        parent = "host-best-effort"
    else:
        parent = ""
    return CgroupPath(base="CgroupRoot", parentDir=parent, relativePath=app.name)


def host_app_context(layout: CgroupLayout, app: HostApplicationSpec) -> HostAppContext:
    """HostAppContext with the checked, confined cgroup dir (CgroupError / PathEscapeError if refused)."""
    rel = host_app_dir(layout, host_app_cgroup_path(app))
    return HostAppContext(HostAppRequest(name=app.name, qos=qos_from_name(app.qos), cgroup_parent=rel))


def _subdirs(layout: CgroupLayout, rel: str) -> list[str]:
    try:
        base = layout.subsystem_dir(rel, "cpu")
        return sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
    except (OSError, CgroupError):
        return []


def _read_procs(layout: CgroupLayout, cdir: str) -> list[int]:
    path = layout.subsystem_dir(cdir, "cpu") / "cgroup.procs"
    return [int(x) for x in path.read_text().split() if x.strip().isdigit()]


def set_oom_score_adj(
    proc_root: Path, pids: Sequence[int], value: int, decisions: DecisionLog | None = None
) -> tuple[int, int]:
    """Write `value` to each PID's oom_score_adj where it differs; returns (updated, skipped)."""
    updated = skipped = 0
    for pid in pids:
        path = proc_root / str(pid) / "oom_score_adj"
        try:
            current = int(path.read_text().strip())
        except (OSError, ValueError):
            skipped += 1
            continue
        if current == value:
            continue
        if decisions is not None and decisions.dry_run:
            decisions.record(
                STRATEGY, f"pid/{pid}/oom_score_adj", "write", current, value, "OOMScoreAdj", dry_run=True
            )
            continue
        try:
            path.write_text(str(value))
        except OSError:
            skipped += 1
            continue
        updated += 1
        if decisions is not None:
            decisions.record(
                STRATEGY, f"pid/{pid}/oom_score_adj", "write", current, value, "OOMScoreAdj", quiet=True
            )
    return updated, skipped


def qos_of(pod: PodInfo) -> QoSClass:
    """PodQOSFilter condition of a PodInfo as a QoSClass."""
    return QoSClass(pod_qos_condition(pod.labels, pod.annotations))


__all__ = [
    "HookReconciler",
    "PassResult",
    "host_app_cgroup_path",
    "host_app_context",
    "pod_extended",
    "qos_of",
    "set_oom_score_adj",
]
