"""CPU topology from `<sys-root>/devices/system/cpu`: core, socket and NUMA node of each online CPU."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from koordqos.cgroups.resources import parse_cpuset
from koordqos.metrics.procfs import read_text

_NODE_DIR = re.compile(r"^node(\d+)$")


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """One logical CPU."""

    cpu: int
    core: int
    socket: int
    node: int


@dataclass(frozen=True, slots=True)
class CpuTopology:
    """The node's logical CPUs (sorted by id)."""

    cpus: tuple[CpuInfo, ...]

    @property
    def cpu_ids(self) -> frozenset[int]:
        """All online CPU ids."""
        return frozenset(c.cpu for c in self.cpus)

    def __len__(self) -> int:
        return len(self.cpus)

    def by_core(self) -> Mapping[tuple[int, int], tuple[int, ...]]:
        """CPU ids grouped by physical core ((socket, core) → cpus), for sibling-aware picking."""
        out: dict[tuple[int, int], list[int]] = {}
        for c in self.cpus:
            out.setdefault((c.socket, c.core), []).append(c.cpu)
        return {k: tuple(v) for k, v in sorted(out.items())}

    def by_node(self) -> Mapping[int, tuple[int, ...]]:
        """CPU ids grouped by NUMA node."""
        out: dict[int, list[int]] = {}
        for c in self.cpus:
            out.setdefault(c.node, []).append(c.cpu)
        return {k: tuple(v) for k, v in sorted(out.items())}


def _int_file(path: Path, default: int) -> int:
    text = read_text(path)
    if text is None:
        return default
    try:
        return int(text.strip())
    except ValueError:
        return default


def read_topology(sys_root: Path | str, fallback_cpus: int | None = None) -> CpuTopology:
    """Read the topology; without sysfs data, `fallback_cpus` flat CPUs (one core each, socket 0, node 0)."""
    base = Path(sys_root) / "devices/system/cpu"
    online_text = read_text(base / "online")
    ids: frozenset[int] = frozenset()
    if online_text is not None:
        try:
            ids = parse_cpuset(online_text)
        except ValueError:
            ids = frozenset()
    if not ids:
        try:
            ids = frozenset(
                int(name[3:]) for name in os.listdir(base) if name.startswith("cpu") and name[3:].isdigit()
            )
        except OSError:
            ids = frozenset()
    if not ids:
        n = fallback_cpus if fallback_cpus is not None else (os.cpu_count() or 1)
        return CpuTopology(tuple(CpuInfo(i, i, 0, 0) for i in range(n)))
    cpus = []
    for cpu in sorted(ids):
        d = base / f"cpu{cpu}"
        core = _int_file(d / "topology/core_id", cpu)
        socket = _int_file(d / "topology/physical_package_id", 0)
        node = 0
        try:
            for name in os.listdir(d):
                m = _NODE_DIR.match(name)
                if m:
                    node = int(m.group(1))
                    break
        except OSError:
            pass
        cpus.append(CpuInfo(cpu, core, socket, node))
    return CpuTopology(tuple(cpus))
