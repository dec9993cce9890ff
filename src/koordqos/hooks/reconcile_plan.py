"""One reconcile pass, computed: the cgroup writes and host targets that make NodeState's pods true.

`ReconcilePlanner.steps` builds the contexts from NodeState (kube-QoS dirs, pods, containers, host
applications), runs the applicable reconcile functions and fills a `PassResult`; it yields after each pod so
the caller can pace a pass over hundreds of pods. Apart from listing dangling pod dirs after a bvt rule
change it reads nothing and writes nothing: the reconciler hands the result to the actuators.
Pods in phase Succeeded/Failed are skipped (project decision §8.6).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.cgroups.layout import CgroupLayout
from koordqos.errors import CgroupError
from koordqos.hooks.completion import container_writes, host_app_writes, kube_qos_writes, pod_writes
from koordqos.hooks.context import ContainerContext, KubeQoSContext
from koordqos.hooks.host_intents import CookieTarget, OomTarget
from koordqos.hooks.hostapps import host_app_context
from koordqos.hooks.podviews import PodView, container_contexts, pod_context, pod_views
from koordqos.hooks.resources import ExtendedResourceSpecError
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.model.nodeslo import HostApplicationSpec
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.hooks.reconciler")

MAX_WARNED = 4096  # log-once memories; beyond this they are forgotten all at once (bounded memory)
KUBE_QOS_ORDER = (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT)

RECONCILE_ERRORS = Counter(
    "koordqos_hooks_reconcile_errors_total",
    "Reconcile functions that failed, by level",
    ["level"],
    registry=obs.REGISTRY,
)


@dataclass
class PassResult:
    """What one pass computed (tests and /debug read it)."""

    writes: list[CgroupWrite] = field(default_factory=list)
    oom: list[OomTarget] = field(default_factory=list)
    cookies: list[CookieTarget] = field(default_factory=list)
    containers: set[str] = field(default_factory=set)  # "<pod uid>/<container id>" seen this pass
    errors: dict[str, str] = field(default_factory=dict)
    rules_updated: set[str] = field(default_factory=set)
    host_apps: dict[str, str] = field(default_factory=dict)  # host application name → its cgroup dir


class ReconcilePlanner:
    """Computes passes over one RuntimeHooks and layout; remembers which problems it already logged."""

    def __init__(self, hooks: RuntimeHooks, layout: CgroupLayout) -> None:
        self.hooks = hooks
        self.layout = layout
        self.warned: SeenOnce[tuple[str, str]] = SeenOnce(MAX_WARNED)  # (pod uid, error) already logged
        self.apps_warned: SeenOnce[tuple[str, str]] = SeenOnce(MAX_WARNED)  # (host app, error) logged

    def steps(self, state: NodeState, result: PassResult) -> Iterator[None]:
        """Fill `result` with the pass's intents, yielding after each pod so callers can pace the work."""
        self.hooks.refresh_rules(state.node_slo, state.node)
        result.rules_updated = self.hooks.take_updates()
        for kube_qos in KUBE_QOS_ORDER:
            kctx = KubeQoSContext(kube_qos, self.layout.qos_dir(kube_qos))
            self._errors(result, "kubeqos", self.hooks.reconcile_kube_qos(kctx))
            result.writes += kube_qos_writes(kctx)
        bvt_changed = "GroupIdentity" in result.rules_updated
        known_pod_dirs: set[str] = set()
        uids: set[str] = set()
        for view in pod_views(state):
            uids.add(view.uid)
            if view.pod is not None and view.pod.terminated:
                continue
            marks = (len(result.writes), len(result.oom), len(result.cookies))
            try:
                self._pod(view, result, known_pod_dirs, bvt_changed)
            except (CgroupError, ExtendedResourceSpecError, ValueError) as exc:
                self._drop_partial(result, marks)
                self._bad_pod(view.uid, exc, result)
            except Exception as exc:  # any other failure of one pod: skip it, never the pass for the others
                self._drop_partial(result, marks)
                self._bad_pod(view.uid, RuntimeError(f"{type(exc).__name__}: {exc}"), result)
            yield
        if bvt_changed:
            result.writes += self._dangling_bvt(known_pod_dirs)
        self._host_apps(state.node_slo.host_applications if state.node_slo is not None else (), result)
        # pods that left the node: their errors may be logged again if they ever come back
        self.warned.retain(lambda k: k[0] in uids)

    # -- pods and containers ----------------------------------------------------------------------

    def _pod(self, view: PodView, result: PassResult, known: set[str], bvt_changed: bool) -> None:
        pctx, pod_dir, extended = pod_context(view, self.layout)
        known.add(pod_dir)
        self._errors(result, "pod", self.hooks.reconcile_pod(pctx))
        result.writes += pod_writes(pctx)
        bvt = pctx.response.resources.cpu_bvt
        for cctx in container_contexts(view, self.layout, pod_dir, extended):
            result.containers.add(f"{cctx.request.pod_uid}/{cctx.request.container_id}")
            self._errors(result, "container", self.hooks.reconcile_container(cctx))
            result.writes += container_writes(cctx)
            if bvt_changed and bvt is not None and cctx.request.cgroup_parent:
                # the GroupIdentity rule callback rewrites container dirs explicitly
                result.writes.append(
                    CgroupWrite(cctx.request.cgroup_parent, "cpu.bvt_warp_ns", bvt, Level.CONTAINER)
                )
            self._per_process(cctx, result)

    def _per_process(self, cctx: ContainerContext, result: PassResult) -> None:
        """The container's oom_score_adj and core-sched cookie targets (applied to its processes)."""
        r = cctx.request
        oom = self.hooks.oom
        if oom is not None and r.cgroup_parent:
            value = oom.target(cctx)
            if value is not None:
                result.oom.append(OomTarget(r.cgroup_parent, value))
        cs = self.hooks.core_sched
        if cs is not None and r.qos is not QoSClass.SYSTEM and r.cgroup_parent:
            try:
                plan = cs.container_plan(cctx)
            except ValueError as exc:
                result.errors[f"coresched/{r.cgroup_parent}"] = str(exc)
                return
            if plan is not None:
                result.cookies.append(CookieTarget(r.cgroup_parent, r.pod_uid, r.container_id, *plan))

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
        for kube_qos in KUBE_QOS_ORDER:
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
        self.apps_warned.retain(lambda k: k[0] in names)

    # -- problems ---------------------------------------------------------------------------------

    @staticmethod
    def _drop_partial(result: PassResult, marks: tuple[int, int, int]) -> None:
        """Forget what a failed pod had added: a pod is reconciled whole or not at all."""
        del result.writes[marks[0] :]
        del result.oom[marks[1] :]
        del result.cookies[marks[2] :]

    def _bad_pod(self, uid: str, exc: Exception, result: PassResult) -> None:
        result.errors[f"pod/{uid}"] = str(exc)
        RECONCILE_ERRORS.labels("pod").inc()
        key = (uid, str(exc))
        if self.warned.first(key):
            obs.ERRORS.labels("hooks-reconciler", "bad_pod").inc()
            log.warning("pod skipped by the hooks reconciler", pod_uid=uid, error=str(exc))

    def _bad_app(self, name: str, hook: str, error: str, result: PassResult) -> None:
        """Count every time; log each distinct (app, error) once while the app stays in the NodeSLO."""
        RECONCILE_ERRORS.labels("hostapp").inc()
        result.errors["/".join(p for p in ("hostapp", name, hook) if p)] = error
        key = (name, f"{hook}: {error}" if hook else error)
        if self.apps_warned.first(key):
            log.warning("host application not fully reconciled", host_app=name, hook=hook, error=error)

    def _errors(self, result: PassResult, level: str, errors: Mapping[str, str]) -> None:
        for k, v in errors.items():
            RECONCILE_ERRORS.labels(level).inc()
            result.errors[f"{level}/{k}"] = v


def _subdirs(layout: CgroupLayout, rel: str) -> list[str]:
    return layout.list_subdirs(rel, "cpu")  # listed beneath the root: a symlinked dir is not followed
