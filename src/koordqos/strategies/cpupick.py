"""BE cpuset picking (docs/behaviour-qos-manager.md, "BE cpuset picking"): hyper-thread pairs first, spread
round-robin over NUMA×socket buckets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Processor:
    """One logical CPU and where it sits."""

    cpu_id: int
    core_id: int
    socket_id: int
    node_id: int


def pick_be_cpus(n: int, processors: Sequence[Processor]) -> list[int]:
    """Pick `n` CPU ids: whole hyper-thread pairs round-robin over NUMA×socket buckets, then singles."""
    if len(processors) < n:
        return []
    if n <= 0:
        return []
    size = len(processors)
    by_key: dict[int, list[Processor]] = {}
    for p in processors:
        # koordlet's bucket key: one bucket per (NUMA node, socket) combination
        by_key.setdefault((p.node_id + size) * (p.socket_id + 1), []).append(p)
    buckets = [sorted(b, key=lambda p: (p.core_id, p.cpu_id)) for b in by_key.values()]
    buckets.sort(key=lambda b: (-len(b), b[0].cpu_id))

    used: set[int] = set()
    picked: list[int] = []
    need = n
    index = 0
    progressed = False
    while need > 1:
        bucket = buckets[index]
        for i in range(len(bucket) - 1):
            a, b = bucket[i], bucket[i + 1]
            if a.cpu_id in used or b.cpu_id in used or a.core_id != b.core_id:
                continue
            used.update((a.cpu_id, b.cpu_id))
            picked.extend((a.cpu_id, b.cpu_id))
            need -= 2
            progressed = True
            break
        index = (index + 1) % len(buckets)
        if index == 0:
            if not progressed:
                break
            progressed = False

    start = index
    progressed = False
    while need > 0:
        for p in buckets[index]:
            if p.cpu_id not in used:
                used.add(p.cpu_id)
                picked.append(p.cpu_id)
                need -= 1
                progressed = True
                break
        index = (index + 1) % len(buckets)
        if index == start:
            if not progressed:
                break
            progressed = False
    return picked
