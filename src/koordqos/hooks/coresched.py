"""CoreSched: Linux core-scheduling cookies per "core sched group", and cpu.idle per kube-QoS dir
(docs/behaviour-runtime-hooks.md, "CoreSched").

The rule and group computation are pure: `container_plan` says which group a container's processes join;
the reconciler turns that into `koordqos.host.CoreSchedCookie` intents, and the HostActuator (which owns
the cookie caches and the prctl calls) carries them out. Where the kernel has no core scheduling the
plugin reports that once and does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from koordqos.hooks.context import ContainerContext, KubeQoSContext, PodContext, Stage, qos_from_labels
from koordqos.hooks.framework import HookFn, HookPlugin, HookSpec, Level, Reconciler
from koordqos.hooks.options import HookOptions
from koordqos.hooks.rules import ClassCPUQOS, SLOView
from koordqos.model.qos import KubeQoS, QoSClass

log = structlog.get_logger("koordqos.hooks.coresched")

NAME = "CoreSched"
GATE = "CoreSched"
LABEL_GROUP_ID = "koordinator.sh/core-sched-group-id"
LABEL_POLICY = "koordinator.sh/core-sched-policy"
POLICY_CORE_SCHED = "coreSched"
EXPELLER_SUFFIX = "-expeller"


@dataclass(frozen=True, slots=True)
class Param:
    """One class's core-sched parameters."""

    is_pod_enabled: bool = False
    is_expeller: bool = False
    is_cpu_idle: bool = False


@dataclass(frozen=True)
class CoreSchedRule:
    """Parsed rule; `inited` once both maps are filled."""

    enable: bool = False
    pod_qos_params: Mapping[QoSClass, Param] = field(default_factory=dict)
    kube_qos_pod_params: Mapping[KubeQoS, Param] = field(default_factory=dict)

    @property
    def inited(self) -> bool:
        """Both maps are filled."""
        return bool(self.pod_qos_params) and bool(self.kube_qos_pod_params)

    def is_pod_enabled(self, qos: QoSClass, kube_qos: KubeQoS) -> tuple[bool, bool]:
        """(enabled, expeller) for a pod."""
        if not self.enable:
            return False, False
        p = self.pod_qos_params.get(qos) or self.kube_qos_pod_params.get(kube_qos)
        if p is None:
            return False, False
        return p.is_pod_enabled, p.is_expeller


def _param(c: ClassCPUQOS, on: bool) -> Param:
    # expeller and idle do not require enable (koordlet)
    return Param(on and c.enable, on and c.core_expeller, on and c.sched_idle == 1)


def parse_core_sched_rule(view: SLOView) -> CoreSchedRule:
    """Build the rule from merged NodeSLO values."""
    on = view.cpu_policy == POLICY_CORE_SCHED
    lsr, ls, be = _param(view.lsr, on), _param(view.ls, on), _param(view.be, on)
    return CoreSchedRule(
        enable=lsr.is_pod_enabled or ls.is_pod_enabled or be.is_pod_enabled,
        pod_qos_params={QoSClass.LSE: lsr, QoSClass.LSR: lsr, QoSClass.LS: ls, QoSClass.BE: be},
        kube_qos_pod_params={
            KubeQoS.GUARANTEED: lsr if lsr.is_pod_enabled else ls,
            KubeQoS.BURSTABLE: ls,
            KubeQoS.BESTEFFORT: be,
        },
    )


def pod_enabled_and_group(
    rule: CoreSchedRule, labels: Mapping[str, str] | None, uid: str, kube_qos: KubeQoS
) -> tuple[bool, str]:
    """(enabled, group id) of a pod: group label, policy label (exclusive/none), expeller suffix."""
    group = (labels or {}).get(LABEL_GROUP_ID, "")
    policy = (labels or {}).get(LABEL_POLICY, "")
    qos = QoSClass.NONE if labels is None else qos_from_labels(labels)
    enabled, expeller = rule.is_pod_enabled(qos, kube_qos)
    if policy == "exclusive":
        group = uid
    elif policy == "none":
        enabled = False
    if expeller:
        group += EXPELLER_SUFFIX
    return enabled, group


# -- system support -------------------------------------------------------------------------------


def probe_sysfs(proc_root: Path, sys_root: Path) -> tuple[bool, str]:
    """Anolis-style probe: sysctl sched_core, else sched_features with (NO_)CORE_SCHED."""
    if (proc_root / "sys/kernel/sched_core").exists():
        return True, "sysctl supported"
    features = sys_root / "kernel/debug/sched_features"
    try:
        text = features.read_text()
    except OSError:
        return False, "file not exist"
    if "CORE_SCHED" in text.split() or "NO_CORE_SCHED" in text.split():
        return True, "sched_features supported"
    return False, "not supported neither by sysctl nor by sched_features"


class CoreSched(HookPlugin):
    """The hook plugin (reconciler only: no stage hooks)."""

    name = NAME
    gate = GATE

    def __init__(self, supported: bool, reason: str, idle_on_qos_dirs: bool = False) -> None:
        self.supported = supported
        self.reason = reason
        # koordlet writes cpu.idle on the kube-QoS dirs; an idle kubepods/besteffort makes kubelet's
        # cpu.shares write there fail (EINVAL), so kubelet cannot restart (project decision: per BE pod)
        self.idle_on_qos_dirs = idle_on_qos_dirs
        self.rule = CoreSchedRule()
        self._reported = False

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """No stage hooks."""
        return {}

    def reconcilers(self) -> list[Reconciler]:
        """cpu.idle of each pod dir by its class (or, as koordlet, of the kube-QoS dirs); the cookies are the
        reconciler's own step."""
        return [
            Reconciler(Level.KUBE_QOS, "cpu.idle", self.set_kube_qos_cpu_idle),
            Reconciler(Level.POD, "cpu.idle", self.set_pod_cpu_idle),
        ]

    def update_slo(self, view: SLOView) -> bool:
        """The core-sched rule from the NodeSLO."""
        return self.update_rule(view)

    def update_rule(self, view: SLOView) -> bool:
        """Parse the rule; True when it changed."""
        new = parse_core_sched_rule(view)
        if new == self.rule:
            return False
        self.rule = new
        return True

    def set_kube_qos_cpu_idle(self, ctx: KubeQoSContext) -> None:
        """cpu.idle of a kube-QoS dir: koordlet's 1 when its pod class has schedIdle only with
        `idle_on_qos_dirs`; else always 0 (which also undoes an earlier 1 there)."""
        if not self.rule.inited:
            return
        p = self.rule.kube_qos_pod_params.get(ctx.kube_qos)
        idle = self.idle_on_qos_dirs and p is not None and p.is_cpu_idle
        ctx.response.resources.cpu_idle = 1 if idle else 0

    def set_pod_cpu_idle(self, ctx: PodContext) -> None:
        """cpu.idle of a pod dir: 1 when its class has schedIdle (nothing with `idle_on_qos_dirs`: the
        kube-QoS dir carries it, as in koordlet)."""
        if not self.rule.inited or self.idle_on_qos_dirs:
            return
        req = ctx.request
        p = self.rule.pod_qos_params.get(req.qos) or self.rule.kube_qos_pod_params.get(req.kube_qos)
        ctx.response.resources.cpu_idle = 1 if p is not None and p.is_cpu_idle else 0

    def container_plan(self, ctx: ContainerContext) -> tuple[bool, str] | None:
        """(enable, group) for a container, or None when nothing should happen; ValueError for bad dirs."""
        req = ctx.request
        if not req.cgroup_parent or not _is_container_dir(os.path.basename(req.cgroup_parent.rstrip("/"))):
            raise ValueError(f"invalid container cgroup parent {req.cgroup_parent!r}")
        if not req.pod_uid or not req.container_id:
            return None
        if not self.supported:
            if not self._reported:
                self._reported = True
                log.warning(
                    "core scheduling unsupported by this kernel; CoreSched does nothing", reason=self.reason
                )
            return None
        if not self.rule.inited:
            return None
        return pod_enabled_and_group(self.rule, req.pod_labels, req.pod_uid, req.kube_qos)


def _is_container_dir(name: str) -> bool:
    if name.endswith(".scope"):
        return any(name.startswith(p) for p in ("docker-", "cri-containerd-", "crio-", "pouch-"))
    return len(name) >= 12 and all(c in "0123456789abcdef" for c in name)


def _build(opts: HookOptions) -> CoreSched:
    return CoreSched(opts.core_sched_supported, opts.core_sched_reason, opts.cpu_idle_on_qos_dirs)


HOOK: HookSpec[CoreSched] = HookSpec(NAME, GATE, _build)
