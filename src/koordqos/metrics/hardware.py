"""Node hardware facts the NodeResourceTopology reports: NUMA node memory (sysfs), CPU model (procfs).

Reads `<sys-root>/devices/system/node/node<N>/meminfo` ("Node 0 MemTotal:  16375892 kB"), the hugepage
counts under `node<N>/hugepages/`, `/proc/cpuinfo` (`model name`, `vendor_id`), SMT (`devices/system/cpu/smt/
active`), turbo (`devices/system/cpu/intel_pstate/no_turbo`) and the L3 CAT mask
(`fs/resctrl/info/L3/cbm_mask`). Missing files give empty values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.metrics.procfs import parse_meminfo, read_text

_NODE_DIR = re.compile(r"^node(\d+)$")
_NODE_MEMINFO = re.compile(r"^Node\s+\d+\s+(\w+):\s+(\d+)(?:\s+kB)?\s*$")


@dataclass(frozen=True, slots=True)
class NumaMemory:
    """One NUMA node: MemTotal and hugepage totals in bytes."""

    total: int
    hugepages_2mi: int = 0
    hugepages_1gi: int = 0


@dataclass(frozen=True, slots=True)
class CpuBasicInfo:
    """`node.koordinator.sh/cpu-basic-info` inputs."""

    cpu_model: str = ""
    vendor_id: str = ""
    hyper_thread_enabled: bool = False
    turbo_enabled: bool = False
    cat_l3_cbm_mask: str = ""  # resctrl's `info/L3/cbm_mask` (hex), "" without L3 CAT


@dataclass(frozen=True, slots=True)
class NodeHardware:
    """NUMA memory by node id (empty when sysfs has no NUMA information) and the CPU basics."""

    numa: Mapping[int, NumaMemory] = field(default_factory=dict)
    memory_total: int | None = None  # /proc/meminfo MemTotal, for the no-NUMA fallback
    cpu: CpuBasicInfo = CpuBasicInfo()


def _hugepages(node_dir: Path, size_kb: int) -> int:
    text = read_text(node_dir / f"hugepages/hugepages-{size_kb}kB/nr_hugepages")
    try:
        return int(text.strip()) * size_kb * 1024 if text else 0
    except ValueError:
        return 0


def read_numa_memory(sys_root: Path | str) -> dict[int, NumaMemory]:
    """NUMA node id → memory, from sysfs; {} when there is no node directory."""
    base = Path(sys_root) / "devices/system/node"
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    out: dict[int, NumaMemory] = {}
    for name in names:
        m = _NODE_DIR.match(name)
        if not m:
            continue
        text = read_text(base / name / "meminfo")
        if text is None:
            continue
        total = None
        for line in text.splitlines():
            lm = _NODE_MEMINFO.match(line.strip())
            if lm and lm.group(1) == "MemTotal":
                total = int(lm.group(2)) * 1024
        if total is None:
            continue
        out[int(m.group(1))] = NumaMemory(
            total, _hugepages(base / name, 2048), _hugepages(base / name, 1048576)
        )
    return dict(sorted(out.items()))


def read_cpu_basic_info(
    proc_root: Path | str, sys_root: Path | str, threads_per_core: int = 1
) -> CpuBasicInfo:
    """CPU model, vendor, SMT (fallback: more than one thread per core) and turbo (false if unknown)."""
    model = vendor = ""
    text = read_text(Path(proc_root) / "cpuinfo") or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "vendor_id" and not vendor:
            vendor = value.strip()
        if model and vendor:
            break
    cpu_dir = Path(sys_root) / "devices/system/cpu"
    smt = read_text(cpu_dir / "smt/active")
    ht = smt.strip() == "1" if smt is not None else threads_per_core > 1
    no_turbo = read_text(cpu_dir / "intel_pstate/no_turbo")
    turbo = no_turbo is not None and no_turbo.strip() == "0"
    return CpuBasicInfo(model, vendor, ht, turbo, read_cat_l3_cbm_mask(sys_root))


def read_cat_l3_cbm_mask(sys_root: Path | str) -> str:
    """The L3 capacity bitmask resctrl offers (`<sys>/fs/resctrl/info/L3/cbm_mask`, e.g. "7ff"); "" when
    resctrl is not mounted, the CPU has no L3 CAT, or the file is not hex."""
    text = (read_text(Path(sys_root) / "fs/resctrl/info/L3/cbm_mask") or "").strip().lower()
    return text if text and all(c in "0123456789abcdef" for c in text) else ""


def read_hardware(proc_root: Path | str, sys_root: Path | str, threads_per_core: int = 1) -> NodeHardware:
    """Everything above in one call (a few small file reads)."""
    mem_text = read_text(Path(proc_root) / "meminfo")
    total = parse_meminfo(mem_text).get("MemTotal") if mem_text is not None else None
    return NodeHardware(
        read_numa_memory(sys_root), total, read_cpu_basic_info(proc_root, sys_root, threads_per_core)
    )
