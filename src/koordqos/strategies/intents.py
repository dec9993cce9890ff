"""Names and dirs strategies plan with; the intent itself is `cgroups.executor.CgroupWrite`.

Eviction tasks live in eviction.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from koordqos.cgroups.executor import Level

CPUSET_CPUS = "cpuset.cpus"
CFS_QUOTA = "cpu.cfs_quota_us"

# koordlet's audit/event reasons (helpers/reason.go)
REASON_UPDATE_CPU = "UpdateCPU"
REASON_ADJUST_BE_BY_NODE_CPU_USAGE = "AdjustBEByNodeCPUUsage"
REASON_EVICT_BY_NODE_MEMORY_USAGE = "EvictPodByNodeMemoryUsage"
REASON_EVICT_BY_BE_CPU_SATISFACTION = "EvictPodByBECPUSatisfaction"


@dataclass(frozen=True, slots=True)
class BEDir:
    """A cgroup dir of the besteffort subtree: the QoS dir (depth 0), a pod dir (1) or a container dir (2).

    `path` is relative to the cgroup root of the controller (e.g. `kubepods/besteffort/pod<uid>/<id>`).
    """

    path: str
    depth: int


def level_of(depth: int) -> Level:
    """The executor level of a dir `depth` below the besteffort dir (0 QoS, 1 pod, 2 and deeper container)."""
    return Level(min(depth, Level.CONTAINER))
