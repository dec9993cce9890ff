"""The reconciler's host intents, pure: group-identity sysctls, per-process oom_score_adj, cookies.

The reconcile pass plans per container (`OomTarget`, `CookieTarget`); once the containers' PIDs are read
these become one intent per process (oom) or per container (cookie) for the HostActuator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koordqos.hooks.groupidentity import GroupIdentity
from koordqos.host import CoreSchedCookie, OomScoreAdjWrite, SysctlWrite

REASON_GROUP_IDENTITY = "GroupIdentity"
REASON_OOM = "OOMScoreAdj"
REASON_CORE_SCHED = "CoreSched"


@dataclass(frozen=True, slots=True)
class OomTarget:
    """Every process of the container in `cgroup_dir` gets oom_score_adj `value`."""

    cgroup_dir: str
    value: int


@dataclass(frozen=True, slots=True)
class CookieTarget:
    """The processes of a container carry `group`'s core-sched cookie (`enable`) or none."""

    cgroup_dir: str
    pod_uid: str
    container_id: str
    enable: bool
    group: str

    @property
    def key(self) -> str:
        """The container's key in the cookie caches."""
        return f"{self.pod_uid}/{self.container_id}"


def group_identity_sysctls(gi: GroupIdentity | None) -> list[SysctlWrite]:
    """Rule enabled: core scheduling off and group identity on (written only where the sysctls exist)."""
    if gi is None or gi.rule is None or not gi.rule.enable:
        return []
    return [
        SysctlWrite("kernel/sched_core", "0", REASON_GROUP_IDENTITY),
        SysctlWrite("kernel/sched_group_identity_enabled", "1", REASON_GROUP_IDENTITY),
    ]


def oom_intents(targets: Sequence[OomTarget], pids: Mapping[str, Sequence[int]]) -> list[OomScoreAdjWrite]:
    """One write per process of each target container (containers whose PIDs are unknown are skipped)."""
    return [OomScoreAdjWrite(pid, t.value, REASON_OOM) for t in targets for pid in pids.get(t.cgroup_dir, ())]


def cookie_intents(
    targets: Sequence[CookieTarget], pids: Mapping[str, Sequence[int]]
) -> list[CoreSchedCookie]:
    """One cookie intent per container whose PIDs could be read."""
    return [
        CoreSchedCookie(
            t.pod_uid, t.container_id, tuple(pids[t.cgroup_dir]), t.enable, t.group, REASON_CORE_SCHED
        )
        for t in targets
        if t.cgroup_dir in pids
    ]
