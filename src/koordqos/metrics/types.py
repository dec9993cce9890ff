"""Sample types of one metrics round, and the metric kinds kept in the store (docs/behaviour-qos-manager.md,
"Metric windows", "Metric definitions")."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class MetricKind(enum.StrEnum):
    """Series kinds in the MetricStore; the series key is "" (node/BE) or a pod uid / container id."""

    NODE_CPU_USAGE = "node_cpu_usage"  # cores
    NODE_MEMORY_USAGE = "node_memory_usage"  # bytes, MemTotal − MemAvailable
    NODE_MEMORY_USAGE_WITH_CACHE = "node_memory_usage_with_cache"  # bytes, MemTotal − MemFree
    POD_CPU_USAGE = "pod_cpu_usage"  # cores
    POD_MEMORY_USAGE = "pod_memory_usage"  # bytes (working set)
    CONTAINER_CPU_USAGE = "container_cpu_usage"  # cores
    CONTAINER_MEMORY_USAGE = "container_memory_usage"  # bytes (working set)
    CONTAINER_CPU_THROTTLED = "container_cpu_throttled"  # ratio 0..1
    BE_CPU_USAGE = "be_cpu_usage"  # milli-cores
    BE_CPU_REQUEST = "be_cpu_request"  # milli-cores
    BE_CPU_REAL_LIMIT = "be_cpu_real_limit"  # milli-cores
    HOST_APP_CPU_USAGE = "host_application_cpu_usage"  # cores, key = NodeSLO host application name
    HOST_APP_MEMORY_USAGE = "host_application_memory_usage"  # bytes (working set), key = app name


class ContainerSeries(enum.Flag):
    """Which of a pod's containers' series the collector reads (the pod's own are always read).

    A `ContainerDemand` answers it per pod; `ALL` is koordlet's behaviour (every container, every round).
    """

    NONE = 0
    CPU = enum.auto()  # CPU usage and throttling: v1 cpuacct.usage + cpu.stat, v2 cpu.stat
    MEMORY = enum.auto()  # working set: memory.usage_in_bytes / memory.current + memory.stat
    ALL = CPU | MEMORY


def _empty() -> Mapping[str, PodSample]:
    return MappingProxyType({})


def _no_apps() -> Mapping[str, HostAppSample]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NumaSample:
    """One NUMA node's usage: CPU cores (its CPUs' busy ticks) and memory in use (its meminfo without
    page cache and reclaimable slab); None where the source was missing or has no delta yet."""

    node: int
    cpu_usage_cores: float | None = None
    memory_used: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSample:
    """Node-wide usage; None where the source file was missing or the first round has no delta yet."""

    cpu_usage_cores: float | None = None
    memory_total: int | None = None  # bytes
    memory_available: int | None = None
    memory_free: int | None = None
    memory_used: int | None = None  # total − available
    memory_used_with_cache: int | None = None  # total − free
    cpu_count: int = 0
    numa: tuple[NumaSample, ...] = ()  # by node id; empty without NUMA information in sysfs


@dataclass(frozen=True, slots=True)
class ContainerSample:
    """One container's usage (id as in the pod status, `<runtime>://<id>`)."""

    id: str
    name: str
    cpu_usage_cores: float | None = None
    memory_working_set: int | None = None
    throttled_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class PodSample:
    """One pod's usage and its containers' (only the containers whose series were read: see
    `ContainerSeries`; a series not read is None)."""

    uid: str
    cpu_usage_cores: float | None = None
    memory_working_set: int | None = None
    containers: tuple[ContainerSample, ...] = ()
    memory_anon: int | None = None  # inactive_anon + active_anon + unevictable (the reported definition)
    memory_with_cache: int | None = None  # anon + active_file + inactive_file
    # anon + unevictable per NUMA node (memory.numa_stat), read on nodes with more than one NUMA node only
    numa_memory: Mapping[int, int] | None = None


@dataclass(frozen=True, slots=True)
class HostAppSample:
    """A NodeSLO host application's usage, measured in its cgroup dir (relative to the cgroup root)."""

    name: str
    dir: str
    cpu_usage_cores: float | None = None
    memory_working_set: int | None = None
    memory_anon: int | None = None
    memory_with_cache: int | None = None


@dataclass(frozen=True, slots=True)
class BESample:
    """The best-effort aggregate in milli-cores.

    usage of the besteffort dir, Σ batch-cpu requests of BE pods, and the real limit
    min(len(cpuset)×1000, quota×1000/period) (quota −1 → cpuset only).
    """

    usage_milli: int | None = None
    request_milli: int = 0
    real_limit_milli: int | None = None
    cpuset: frozenset[int] = frozenset()
    quota: int | None = None
    period: int | None = None


@dataclass(frozen=True, slots=True)
class MetricSnapshot:
    """Everything one collection round measured (the `sample` of a MetricTick)."""

    at: float
    interval: float
    node: NodeSample = field(default_factory=NodeSample)
    pods: Mapping[str, PodSample] = field(default_factory=_empty)  # by uid
    be: BESample = field(default_factory=BESample)
    host_apps: Mapping[str, HostAppSample] = field(default_factory=_no_apps)  # by app name

    def container(self, container_id: str) -> ContainerSample | None:
        """Find a container sample by id."""
        for pod in self.pods.values():
            for c in pod.containers:
                if c.id == container_id:
                    return c
        return None
