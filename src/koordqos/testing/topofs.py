"""Synthetic sysfs/procfs CPU and NUMA topology for tests (never the machine's real /sys)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from koordqos.model.cpuset import format_cpuset


def write_topology(
    sys_root: Path,
    cpus: Iterable[tuple[int, int, int, int]],
    numa_memtotal_kb: Mapping[int, int] | None = None,
    *,
    smt_active: bool | None = None,
    no_turbo: bool | None = None,
) -> None:
    """Write `devices/system/cpu` for `(cpu, core_id, socket, numa node)` rows (replacing what was there),
    and `devices/system/node/node<N>/meminfo` for the NUMA nodes given."""
    rows = sorted(cpus)
    cpu_dir = sys_root / "devices/system/cpu"
    if cpu_dir.exists():
        shutil.rmtree(cpu_dir)
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(format_cpuset(r[0] for r in rows) + "\n")
    for cpu, core, socket, node in rows:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "physical_package_id").write_text(f"{socket}\n")
        (cpu_dir / f"cpu{cpu}" / f"node{node}").mkdir()
    if smt_active is not None:
        (cpu_dir / "smt").mkdir()
        (cpu_dir / "smt/active").write_text("1\n" if smt_active else "0\n")
    if no_turbo is not None:
        (cpu_dir / "intel_pstate").mkdir()
        (cpu_dir / "intel_pstate/no_turbo").write_text("1\n" if no_turbo else "0\n")
    node_dir = sys_root / "devices/system/node"
    if node_dir.exists():
        shutil.rmtree(node_dir)
    for nid, kb in (numa_memtotal_kb or {}).items():
        d = node_dir / f"node{nid}"
        d.mkdir(parents=True)
        (d / "meminfo").write_text(
            f"Node {nid} MemTotal:       {kb} kB\nNode {nid} MemFree:        {kb // 2} kB\n"
            f"Node {nid} MemUsed:        {kb - kb // 2} kB\n"
        )


def write_cpuinfo(proc_root: Path, model: str, vendor: str, cpus: int) -> None:
    """A minimal /proc/cpuinfo."""
    proc_root.mkdir(parents=True, exist_ok=True)
    blocks = [f"processor\t: {i}\nvendor_id\t: {vendor}\nmodel name\t: {model}\n" for i in range(cpus)]
    (proc_root / "cpuinfo").write_text("\n".join(blocks))
