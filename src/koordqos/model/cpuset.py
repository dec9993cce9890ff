"""Linux cpu-list strings (`0-3,8,10-11`) to sorted CPU id tuples and back."""

from __future__ import annotations

from collections.abc import Iterable

from koordqos.errors import ModelError


def parse_cpuset(text: str) -> tuple[int, ...]:
    """`"0-3,8"` → (0, 1, 2, 3, 8): sorted, unique; "" → (); ModelError on anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            start = int(lo)
            end = int(hi) if sep else start
        except ValueError:
            raise ModelError(f"invalid cpuset {text!r}") from None
        if start < 0 or end < start or end - start > 65535:
            raise ModelError(f"invalid cpuset {text!r}")
        cpus.update(range(start, end + 1))
    return tuple(sorted(cpus))


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
