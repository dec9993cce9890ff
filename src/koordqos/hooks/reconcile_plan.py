"""One reconcile pass, computed: the cgroup writes and host targets that make NodeState's pods true.

`ReconcilePlanner.steps` builds the contexts from NodeState (kube-QoS dirs, pods, containers, host
applications), runs the applicable reconcile functions and fills a `PassResult`; it yields after each pod so
the caller can pace a pass over hundreds of pods. Apart from listing dangling pod dirs after a bvt rule
change it reads nothing and writes nothing: the reconciler hands the result to the actuators.
Pods in phase Succeeded/Failed are skipped (docs/behaviour-runtime-hooks.md, "Project decisions").

A pass is *full* (every pod planned) or *incremental*: a pod whose inputs — its PodInfo, its sandbox, its
runtime containers — equal those of the last pass that planned it is not planned again; what that pass found
for it (its containers, errors and, on request, its per-process targets) is carried over. Everything a pod's
plan reads besides its own inputs is node-wide (the rules from NodeSLO and Node, the layout), so a rule
update or a Node/NodeSLO change makes the pass full. The reconciler runs a full pass now and then anyway so
that a file changed behind the agent's back is still corrected.

Nothing is derived from an incomplete view of the pods: a pod dir on disk that no known pod owns gets its
QoS dir's bvt ("dangling", the GroupIdentity rule callback) only once the pod sources have synced
(`pod_sources`: the API server's list in cluster mode; in local mode also the NRI Synchronize, which delivers
the runtime's pods), so an agent starting over a configured node never resets a live pod's dir for a moment.
A bvt rule change seen earlier is remembered and its dangling step done in the first pass with every pod
known. Container dirs follow their pod's bvt whenever the pod is planned (a new container, a pod change), not
only on rule changes: a pod that arrives after the NodeSLO gets its containers' value too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from immutables import Map
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.cgroups.layout import CgroupLayout
from koordqos.errors import CgroupError
from koordqos.events.types import RuntimeContainer, RuntimeSandbox
from koordqos.hooks.completion import container_writes, host_app_writes, kube_qos_writes, pod_writes
from koordqos.hooks.context import ContainerContext, KubeQoSContext
from koordqos.hooks.host_intents import CookieTarget, OomTarget
from koordqos.hooks.hostapps import host_app_context
from koordqos.hooks.podviews import (
    ContainersByPod,
    PodView,
    container_contexts,
    group_containers,
    pod_context,
    pod_views,
)
from koordqos.hooks.resources import ExtendedResourceSpecError
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import HostApplicationSpec, NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.once import SeenOnce
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.hooks.reconciler")

MAX_WARNED = 4096  # log-once memories; beyond this they are forgotten all at once (bounded memory)
SKIPPED_PER_YIELD = 16  # unchanged pods cost ~2 µs each: a yield per this many, not one per pod
KUBE_QOS_ORDER = (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT)
#: the synced sources (`NodeState.synced`) after which the node's pods are all known: the API server's pod
#: list (cluster mode); local mode's pod source is marked synced at start, its pods come with the NRI
#: Synchronize
CLUSTER_POD_SOURCES = frozenset({"pods"})
LOCAL_POD_SOURCES = frozenset({"pods", "nri"})

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
    full: bool = True  # every pod planned (else only pods whose inputs changed)
    planned: list[str] = field(default_factory=list)  # uids of the pods planned in this pass, in order
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # planned uid → its slice of `writes`


PodKey = tuple[PodInfo | None, RuntimeSandbox | None, tuple[RuntimeContainer, ...]]


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod as the last pass that planned it saw it (`key`) and what that pass found for it."""

    key: PodKey
    containers: tuple[str, ...]
    oom: tuple[OomTarget, ...]
    cookies: tuple[CookieTarget, ...]
    errors: tuple[tuple[str, str], ...]


class ReconcilePlanner:
    """Computes passes over one RuntimeHooks and layout; remembers which problems it already logged."""

    def __init__(
        self, hooks: RuntimeHooks, layout: CgroupLayout, pod_sources: frozenset[str] = CLUSTER_POD_SOURCES
    ) -> None:
        self.hooks = hooks
        self.layout = layout
        self.pod_sources = pod_sources
        # a bvt rule change whose dangling-pod-dir step waits for a complete view of the pods
        self._dangling_due = False
        # (pod uid, error) already logged, scoped by pod uid; (host app, error) logged, scoped by app name
        self.warned: SeenOnce[tuple[str, str]] = SeenOnce(MAX_WARNED, scoped=True)
        self.apps_warned: SeenOnce[tuple[str, str]] = SeenOnce(MAX_WARNED, scoped=True)
        self.records: dict[str, PodRecord] = {}  # uid → the pod as last planned
        self._node_wide: tuple[NodeInfo | None, NodeSLO | None] | None = None  # what the last pass saw
        # the runtime containers grouped by pod, for the containers mapping they were grouped from
        self._grouped: tuple[Mapping[str, RuntimeContainer], ContainersByPod] | None = None

    def steps(
        self, state: NodeState, result: PassResult, *, full: bool = True, all_processes: bool = True
    ) -> Iterator[None]:
        """Fill `result` with the pass's intents, yielding after each planned pod so callers can pace it.

        `full=False`: plan only the pods whose inputs changed since the pass that last planned them (the pass
        becomes full when the rules, the Node or the NodeSLO changed). `all_processes`: the per-process
        targets (oom_score_adj, core-sched cookies) of every pod, carried over for unchanged pods, so new
        processes in unchanged containers are still caught; otherwise only those of the planned pods.
        """
        self.hooks.refresh(state)
        result.rules_updated = self.hooks.take_updates()
        if "GroupIdentity" in result.rules_updated:
            self._dangling_due = True
        # the dangling step needs every pod dir of the pass: a full pass, once every pod is known
        dangling = self._dangling_due and self.pod_sources <= state.synced
        node_wide = (state.node, state.node_slo)
        if result.rules_updated or dangling or node_wide != self._node_wide:
            full = True
        self._node_wide = node_wide
        result.full = full
        for kube_qos in KUBE_QOS_ORDER:
            kctx = KubeQoSContext(kube_qos, self.layout.qos_dir(kube_qos))
            self._errors(result, "kubeqos", self.hooks.reconcile_kube_qos(kctx))
            result.writes += kube_qos_writes(kctx)
        known_pod_dirs: set[str] = set()
        uids: set[str] = set()
        records = self.records
        skipped = 0
        grouped = self._grouped
        runtime = state.containers
        if grouped is not None and grouped[0] is runtime:
            ctrs = grouped[1]  # no runtime change since the last pass: the reducer replaces the mapping
        else:
            ctrs = {}
            yield  # the grouping is a pass's longest stretch without a pod: its own steps
            yield from group_containers(runtime, ctrs)
            # kept only for a persistent map (the reducer's): a plain dict may change in place
            self._grouped = (runtime, ctrs) if type(runtime) is Map else None
        for view in pod_views(state, ctrs):
            uids.add(view.uid)
            if view.pod is not None and view.pod.terminated:
                records.pop(view.uid, None)
                continue
            key: PodKey = (view.pod, view.sandbox, view.containers)
            rec = records.get(view.uid)
            if not full and rec is not None and rec.key == key:
                result.containers.update(rec.containers)
                result.errors.update(rec.errors)
                if all_processes:
                    result.oom += rec.oom
                    result.cookies += rec.cookies
                skipped += 1
                if skipped % SKIPPED_PER_YIELD == 0:
                    yield
                continue
            marks = (len(result.writes), len(result.oom), len(result.cookies))
            n_errors = len(result.errors)
            containers: list[str] = []
            try:
                self._pod(view, result, known_pod_dirs, containers)
            except (CgroupError, ExtendedResourceSpecError, ValueError) as exc:
                self._drop_partial(result, marks)
                self._bad_pod(view.uid, exc, result)
            except Exception as exc:  # any other failure of one pod: skip it, never the pass for the others
                self._drop_partial(result, marks)
                self._bad_pod(view.uid, RuntimeError(f"{type(exc).__name__}: {exc}"), result)
            result.planned.append(view.uid)
            result.spans[view.uid] = (marks[0], len(result.writes))
            records[view.uid] = PodRecord(
                key,
                tuple(containers),
                tuple(result.oom[marks[1] :]),
                tuple(result.cookies[marks[2] :]),
                tuple(list(result.errors.items())[n_errors:]) if len(result.errors) > n_errors else (),
            )
            yield
        for gone in records.keys() - uids:
            del records[gone]
        if dangling:
            result.writes += self._dangling_bvt(known_pod_dirs)
            self._dangling_due = False
        self._host_apps(state.node_slo.host_applications if state.node_slo is not None else (), result)
        # pods that left the node: their errors may be logged again if they ever come back
        self.warned.retain_scopes(uids)

    def forget(self, uid: str) -> None:
        """Plan `uid` again in the next pass (its writes did not all land: a dir missing, a write failed)."""
        self.records.pop(uid, None)

    def forget_all(self) -> None:
        """Make the next pass full (a pass failed half-way: a rule change may not have been applied)."""
        self.records.clear()
        self._node_wide = None
        self._dangling_due = True  # the dangling step may not have landed either

    # -- pods and containers ----------------------------------------------------------------------

    def _pod(self, view: PodView, result: PassResult, known: set[str], containers: list[str]) -> None:
        pctx, pod_dir, extended = pod_context(view, self.layout)
        known.add(pod_dir)
        self._errors(result, "pod", self.hooks.reconcile_pod(pctx))
        result.writes += pod_writes(pctx)
        bvt = pctx.response.resources.cpu_bvt
        for cctx in container_contexts(view, self.layout, pod_dir, extended):
            ckey = f"{cctx.request.pod_uid}/{cctx.request.container_id}"
            result.containers.add(ckey)
            containers.append(ckey)
            self._errors(result, "container", self.hooks.reconcile_container(cctx))
            result.writes += container_writes(cctx)
            if bvt is not None and cctx.request.cgroup_parent:
                # container dirs follow their pod's bvt (the rule callback's container step, on every plan of
                # the pod: a container created after the rule change gets it too)
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

    # -- host applications (docs/behaviour-runtime-hooks.md, "Host applications") -----------------

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
        self.apps_warned.retain_scopes(names)

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
        if self.warned.first(key, scope=uid):
            obs.ERRORS.labels("hooks-reconciler", "bad_pod").inc()
            log.warning("pod skipped by the hooks reconciler", pod_uid=uid, error=str(exc))

    def _bad_app(self, name: str, hook: str, error: str, result: PassResult) -> None:
        """Count every time; log each distinct (app, error) once while the app stays in the NodeSLO."""
        RECONCILE_ERRORS.labels("hostapp").inc()
        result.errors["/".join(p for p in ("hostapp", name, hook) if p)] = error
        key = (name, f"{hook}: {error}" if hook else error)
        if self.apps_warned.first(key, scope=name):
            log.warning("host application not fully reconciled", host_app=name, hook=hook, error=error)

    def _errors(self, result: PassResult, level: str, errors: Mapping[str, str]) -> None:
        for k, v in errors.items():
            RECONCILE_ERRORS.labels(level).inc()
            result.errors[f"{level}/{k}"] = v


def _subdirs(layout: CgroupLayout, rel: str) -> list[str]:
    return layout.list_subdirs(rel, "cpu")  # listed beneath the root: a symlinked dir is not followed
