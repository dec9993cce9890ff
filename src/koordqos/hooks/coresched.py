"""CoreSched: Linux core-scheduling cookies per "core sched group", and cpu.idle per kube-QoS dir (§3.5).

The rule and group computation are pure; cookie changes go through a `CookieOps` (prctl on the real
kernel, a fake in tests). Where the kernel has no core scheduling the plugin reports that once and
does nothing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from koordqos.hooks.context import ContainerContext, KubeQoSContext, Stage, qos_from_labels
from koordqos.hooks.framework import HookFn
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


# -- cookies --------------------------------------------------------------------------------------


class CookieOps(Protocol):
    """Core-scheduling cookie operations on thread groups."""

    def get(self, pid: int) -> int:
        """The cookie of `pid` (0 = none); OSError on failure."""
        ...

    def create(self, pid: int) -> int:
        """Give `pid`'s thread group a new cookie and return it; OSError on failure."""
        ...

    def assign(self, from_pid: int, pids: Sequence[int]) -> list[int]:
        """Copy `from_pid`'s cookie to `pids`; return the pids that failed."""
        ...

    def clear(self, pids: Sequence[int]) -> list[int]:
        """Reset the cookie of `pids` to 0; return the pids that failed."""
        ...


PR_SCHED_CORE = 62
PR_SCHED_CORE_GET = 0
PR_SCHED_CORE_CREATE = 1
PR_SCHED_CORE_SHARE_TO = 2
PR_SCHED_CORE_SHARE_FROM = 3
PIDTYPE_PID = 0
PIDTYPE_TGID = 1


class PrctlCookieOps:
    """CookieOps through prctl(PR_SCHED_CORE). Sharing goes through the calling thread's cookie."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _prctl(self, op: int, pid: int, scope: int, arg: int = 0) -> None:
        if self._libc.prctl(PR_SCHED_CORE, op, pid, scope, ctypes.c_void_p(arg) if arg else 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def get(self, pid: int) -> int:
        """The cookie of `pid`."""
        cookie = ctypes.c_ulonglong(0)
        if self._libc.prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, pid, PIDTYPE_PID, ctypes.byref(cookie)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(cookie.value)

    def create(self, pid: int) -> int:
        """New cookie on the thread group of `pid`."""
        self._prctl(PR_SCHED_CORE_CREATE, pid, PIDTYPE_TGID)
        return self.get(pid)

    def assign(self, from_pid: int, pids: Sequence[int]) -> list[int]:
        """Pull the cookie into this thread, push it to each target, then drop it again."""
        self._prctl(PR_SCHED_CORE_SHARE_FROM, from_pid, PIDTYPE_PID)
        failed = []
        try:
            for pid in pids:
                try:
                    self._prctl(PR_SCHED_CORE_SHARE_TO, pid, PIDTYPE_TGID)
                except OSError:
                    failed.append(pid)
        finally:
            self._reset_self()
        return failed

    def clear(self, pids: Sequence[int]) -> list[int]:
        """Push this thread's (empty) cookie to each target."""
        self._reset_self()
        failed = []
        for pid in pids:
            try:
                self._prctl(PR_SCHED_CORE_SHARE_TO, pid, PIDTYPE_TGID)
            except OSError:
                failed.append(pid)
        return failed

    def _reset_self(self) -> None:
        # init never carries a cookie; copying it back leaves this thread without one
        self._prctl(PR_SCHED_CORE_SHARE_FROM, 1, PIDTYPE_PID)


@dataclass
class CookieEntry:
    """A group's cookie and the PIDs known to carry it."""

    cookie: int
    pids: set[int] = field(default_factory=set)


class CookieManager:
    """Cookie and group caches; `enable` / `disable` one container's PIDs."""

    def __init__(self, ops: CookieOps) -> None:
        self.ops = ops
        self.cookies: dict[str, CookieEntry] = {}
        self.groups: dict[str, str] = {}  # "<pod uid>/<container id>" → group

    def enable(self, pod_uid: str, container_id: str, group: str, pids: Sequence[int]) -> None:
        """Make every PID of the container carry the group's cookie."""
        if not pids:
            return
        key = f"{pod_uid}/{container_id}"
        entry = self.cookies.get(group)
        if entry is not None and entry.cookie:
            if set(pids) <= entry.pids:
                self.groups[key] = group
                return
            if self._assign(entry, pids):
                self.groups[key] = group
                return
        self._add(group, pids)
        self.groups[key] = group

    def _assign(self, entry: CookieEntry, pids: Sequence[int]) -> bool:
        sibling = None
        for pid in sorted(entry.pids):
            try:
                if self.ops.get(pid) == entry.cookie:
                    sibling = pid
                    break
            except OSError:
                continue
        if sibling is None:
            return False
        todo = []
        for pid in pids:
            try:
                if self.ops.get(pid) != entry.cookie:
                    todo.append(pid)
                else:
                    entry.pids.add(pid)
            except OSError:
                continue
        failed = set(self.ops.assign(sibling, todo)) if todo else set()
        entry.pids.update(p for p in todo if p not in failed)
        return True

    def _add(self, group: str, pids: Sequence[int]) -> None:
        try:
            cookie = self.ops.create(pids[0])
        except OSError as exc:
            log.warning("core sched cookie create failed", group=group, pid=pids[0], error=str(exc))
            return
        failed = set(self.ops.assign(pids[0], list(pids[1:]))) if len(pids) > 1 else set()
        self.cookies[group] = CookieEntry(cookie, {pids[0], *(p for p in pids[1:] if p not in failed)})

    def prune(self, live_containers: Collection[str], proc_root: Path) -> None:
        """Forget containers not seen any more, PIDs no longer under `proc_root`, and emptied cookies.

        A dead PID left in a group could be reused by a new process, which `enable` would then take as
        already carrying the cookie; an unpruned cache also grows with every container ever seen.
        """
        live = set(live_containers)
        for key in [k for k in self.groups if k not in live]:
            del self.groups[key]
        for entry in self.cookies.values():
            entry.pids = {pid for pid in entry.pids if (proc_root / str(pid)).exists()}
        # a cookie with no live carrier cannot be shared again (assign needs a sibling); the next
        # enable of the group creates a fresh one
        for group in [g for g, e in self.cookies.items() if not e.pids]:
            del self.cookies[group]

    def disable(self, pod_uid: str, container_id: str, pids: Sequence[int]) -> None:
        """Clear the cookie of the container's PIDs (only if it had a group)."""
        key = f"{pod_uid}/{container_id}"
        group = self.groups.pop(key, None)
        if group is None:
            return
        todo = []
        for pid in pids:
            try:
                if self.ops.get(pid) != 0:
                    todo.append(pid)
            except OSError:
                continue
        failed = set(self.ops.clear(todo)) if todo else set()
        entry = self.cookies.get(group)
        if entry is not None:
            entry.pids.difference_update(p for p in todo if p not in failed)


class CoreSched:
    """The hook plugin (reconciler only: no stage hooks)."""

    name = NAME
    gate = GATE

    def __init__(self, supported: bool, reason: str, ops: CookieOps | None = None) -> None:
        self.supported = supported
        self.reason = reason
        self.rule = CoreSchedRule()
        self.cookies = CookieManager(ops) if ops is not None else None
        self._reported = False

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """No stage hooks."""
        return {}

    def update_rule(self, view: SLOView) -> bool:
        """Parse the rule; True when it changed."""
        new = parse_core_sched_rule(view)
        if new == self.rule:
            return False
        self.rule = new
        return True

    def set_kube_qos_cpu_idle(self, ctx: KubeQoSContext) -> None:
        """cpu.idle of a kube-QoS dir: 1 when its pod class has schedIdle, else 0."""
        if not self.rule.inited:
            return
        p = self.rule.kube_qos_pod_params.get(ctx.kube_qos)
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
