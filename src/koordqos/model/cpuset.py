"""Linux cpu-list strings (`0-3,8,10-11`) to sorted CPU id tuples and back."""

from __future__ import annotations

from collections.abc import Iterable

from koordqos.errors import ModelError

#: CPU ids above this are not a CPU (Linux's NR_CPUS is at most 8192 today); it bounds the work and memory
#: of a cpu-list from API objects (`0-65535,1000000-1065535,...` in a 256 KiB annotation: 10^9 insertions)
MAX_CPU_ID = 65535


def parse_cpuset(text: str) -> tuple[int, ...]:
    """`"0-3,8"` → (0, 1, 2, 3, 8): sorted, unique; "" → (); ModelError on anything else (ids above
    MAX_CPU_ID included). The ranges are merged first: the work is bounded by the text and MAX_CPU_ID."""
    ranges: list[tuple[int, int]] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            start = int(lo)
            end = int(hi) if sep else start
        except ValueError:
            raise ModelError(f"invalid cpuset {text[:80]!r}") from None
        if start < 0 or end < start or end > MAX_CPU_ID:
            raise ModelError(f"invalid cpuset {text[:80]!r}")
        ranges.append((start, end))
    ranges.sort()
    cpus: list[int] = []
    upto = -1  # the highest id taken so far
    for start, end in ranges:
        if end > upto:
            cpus.extend(range(max(start, upto + 1), end + 1))
            upto = end
    return tuple(cpus)


def cpu_set(text: str) -> frozenset[int]:
    """Like `parse_cpuset`, as a set, raising ValueError (for cgroup values and hook inputs)."""
    try:
        return frozenset(parse_cpuset(text))
    except ModelError as exc:
        raise ValueError(str(exc)) from None


def format_cpuset(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) → `"0-3,8"` (sorted, ranges collapsed)."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)
