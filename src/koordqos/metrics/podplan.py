"""A pod's read plan for the metrics collector: its dirs, counter keys and the cgroup files one round reads
(one `FileSet`), read in a worker thread (`read_sets`); and the parse of its `memory.numa_stat`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from koordqos.cgroups.reader import FileSet
from koordqos.metrics.types import (
    ContainerSeries,
)
from koordqos.model.pod import PodInfo


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    id: str
    name: str
    dir: str
    cpu_key: str
    thr_key: str


@dataclass(frozen=True, slots=True)
class PodPlan:
    """A pod's dirs, counter keys and its FileSet: pod files first (CPU usage, memory usage, memory.stat),
    then per container (when `series` asks for them) CPU usage and, on v1, cpu.stat (v2: one cpu.stat serves
    usage and throttling), then memory usage and memory.stat. `slo` is the NodeSLO the demand was asked under
    (None without a demand)."""

    pod: PodInfo
    dir: str
    cpu_key: str
    containers: tuple[ContainerPlan, ...]
    files: FileSet
    series: ContainerSeries
    slo: object
    read_cpu: bool
    read_memory: bool
    numa: bool = False  # memory.numa_stat is the fourth file (multi-NUMA nodes only)


def pod_files(
    v2: bool, pod_dir: str, container_dirs: list[str], series: ContainerSeries, numa: bool = False
) -> list[tuple[str, str, str]]:
    cpu = ("cpu", "cpu.stat") if v2 else ("cpuacct", "cpuacct.usage")
    usage = "memory.current" if v2 else "memory.usage_in_bytes"
    out = [(pod_dir, *cpu), (pod_dir, "memory", usage), (pod_dir, "memory", "memory.stat")]
    if numa:
        out.append((pod_dir, "memory", "memory.numa_stat"))
    read_cpu = ContainerSeries.CPU in series
    read_memory = ContainerSeries.MEMORY in series
    for d in container_dirs:
        if read_cpu:
            out.append((d, *cpu))
            if not v2:
                out.append((d, "cpu", "cpu.stat"))
        if read_memory:
            out += [(d, "memory", usage), (d, "memory", "memory.stat")]
    return out


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def numa_anon_of(data: bytes | None, v2: bool, page_size: int = PAGE_SIZE) -> dict[int, int] | None:
    """anon + unevictable bytes per NUMA node from a pod's `memory.numa_stat` (v1: the `hierarchical_` lines,
    in pages; v2: `anon` / `unevictable`, in bytes); None when the file is missing or has neither line."""
    if data is None:
        return None
    keys = (b"anon", b"unevictable") if v2 else (b"hierarchical_anon", b"hierarchical_unevictable")
    scale = 1 if v2 else page_size
    out: dict[int, int] = {}
    found = False
    for line in data.splitlines():
        fields = line.split()
        if not fields:
            continue
        name = fields[0].split(b"=", 1)[0] if not v2 else fields[0]
        if name not in keys:
            continue
        found = True
        for item in fields[1:]:
            key, sep, value = item.partition(b"=")
            if not sep or not key.startswith(b"N"):
                continue
            try:
                out[int(key[1:])] = out.get(int(key[1:]), 0) + int(value) * scale
            except ValueError:
                continue
    return out if found else None


def read_sets(clock: Callable[[], float], plans: list[PodPlan]) -> list[tuple[float, list[bytes | None]]]:
    """Read every plan's files (in a worker thread: no loop state is touched), each with its time."""
    return [(clock(), p.files.read()) for p in plans]
