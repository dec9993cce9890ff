"""Parsers for /proc/stat and /proc/meminfo (sans-I/O: text in, numbers out) and their readers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

USER_HZ = 100


@dataclass(frozen=True, slots=True)
class CpuTicks:
    """Cumulative ticks of the aggregate `cpu` line; busy = user+nice+system+irq+softirq
    (docs/behaviour-qos-manager.md, "Metric definitions")."""

    busy: int
    total: int
    online_cpus: int


def parse_proc_stat(text: str) -> CpuTicks | None:
    """Parse /proc/stat; None when there is no well-formed `cpu` line."""
    busy = total = -1
    cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = line.split()[1:]
            try:
                nums = [int(f) for f in fields]
            except ValueError:
                return None
            if len(nums) < 7:
                return None
            user, nice, system, _idle, _iowait, irq, softirq = nums[:7]
            busy = user + nice + system + irq + softirq
            total = sum(nums[:8])
        elif line.startswith("cpu") and line[3:4].isdigit():
            cpus += 1
    if busy < 0:
        return None
    return CpuTicks(busy, total, cpus)


def parse_cpu_busy(text: str) -> dict[int, int]:
    """Busy ticks (user+nice+system+irq+softirq) of each `cpuN` line of /proc/stat (malformed: left out)."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        if not (line.startswith("cpu") and line[3:4].isdigit()):
            continue
        fields = line.split()
        try:
            cpu = int(fields[0][3:])
            user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[1:8])
        except ValueError:
            continue
        out[cpu] = user + nice + system + irq + softirq
    return out


def parse_node_meminfo(text: str) -> dict[str, int]:
    """A NUMA node's `meminfo` ("Node 0 MemFree:   123 kB") into bytes by key."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] != "Node" or not parts[2].endswith(":"):
            continue
        try:
            value = int(parts[3])
        except ValueError:
            continue
        out[parts[2][:-1]] = value * 1024 if len(parts) > 4 and parts[4] == "kB" else value
    return out


def numa_memory_used(info: dict[str, int]) -> int | None:
    """koordlet's NUMA node usage: MemTotal − (MemFree + Active(file) + Inactive(file) + SReclaimable),
    floored at 0; None without MemTotal or MemFree."""
    total, free = info.get("MemTotal"), info.get("MemFree")
    if total is None or free is None:
        return None
    cache = info.get("Active(file)", 0) + info.get("Inactive(file)", 0) + info.get("SReclaimable", 0)
    return max(total - free - cache, 0)


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo into bytes by key ("MemTotal: 123 kB" → {"MemTotal": 125952})."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


def read_text(path: Path) -> str | None:
    """A small file's text, None when missing or unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None
