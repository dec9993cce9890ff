"""Parsers of cgroup file contents, pure: flat-keyed files (memory.stat, cpu.stat), CPU usage and
throttling counters, memory usage, the LRU lists and the working set, for cgroup v1 and v2."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CpuStat:
    """CFS bandwidth counters from `cpu.stat` (throttled time in ns)."""

    nr_periods: int
    nr_throttled: int
    throttled_ns: int


@dataclass(frozen=True, slots=True)
class MemoryReadings:
    """One cgroup's memory by three definitions (bytes); None where memory.stat was unreadable."""

    working_set: int
    anon: int | None
    with_cache: int | None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Parse "key value" lines (cpu.stat, memory.stat); lines that do not fit are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def stat_value(text: str, key: str) -> int | None:
    """One value of a "key value" file without parsing the rest (memory.stat has ~40 lines)."""
    needle = key + " "
    i = 0 if text.startswith(needle) else text.find("\n" + needle) + 1
    if i == 0 and not text.startswith(needle):
        return None
    end = text.find("\n", i)
    try:
        return int(text[i + len(needle) : end if end >= 0 else None])
    except ValueError:
        return None


def stat_value_bytes(data: bytes, key: bytes) -> int | None:
    """`stat_value` on the raw bytes of a file (no decode: the collector's hot path)."""
    needle = key + b" "
    return _stat_value(data, needle, b"\n" + needle)


def _stat_value(data: bytes, needle: bytes, line_needle: bytes) -> int | None:
    """`stat_value_bytes` with its needles made once: `key + b" "` and `b"\\n" + key + b" "`."""
    if data.startswith(needle):
        i = 0
    else:
        i = data.find(line_needle) + 1
        if i == 0:
            return None
    end = data.find(b"\n", i)
    try:
        return int(data[i + len(needle) : end if end >= 0 else None])
    except ValueError:
        return None


_PERIODS = (b"nr_periods ", b"\nnr_periods ")
_THROTTLED = (b"nr_throttled ", b"\nnr_throttled ")


def throttle_counts_of(data: bytes | None) -> tuple[int, int] | None:
    """(nr_periods, nr_throttled) of `cpu.stat` bytes, as `cpu_stat_of` reads them (the collector's path:
    no CpuStat); None without nr_periods."""
    if data is None:
        return None
    periods = _stat_value(data, *_PERIODS)
    if periods is None:
        return None
    return periods, _stat_value(data, *_THROTTLED) or 0


def usage_ns_of(data: bytes | None, v2: bool) -> int | None:
    """Cumulative CPU ns from v1 `cpuacct.usage` or v2 `cpu.stat` (usage_usec × 1000)."""
    if data is None:
        return None
    if v2:
        usec = stat_value_bytes(data, b"usage_usec")
        return None if usec is None else usec * 1000
    try:
        return int(data)
    except ValueError:
        return None


def cpu_stat_of(data: bytes | None) -> CpuStat | None:
    """Throttling counters from `cpu.stat` bytes (v1 throttled_time ns, v2 throttled_usec)."""
    if data is None:
        return None
    periods = stat_value_bytes(data, b"nr_periods")
    if periods is None:
        return None
    usec = stat_value_bytes(data, b"throttled_usec")
    throttled = usec * 1000 if usec is not None else stat_value_bytes(data, b"throttled_time") or 0
    return CpuStat(periods, stat_value_bytes(data, b"nr_throttled") or 0, throttled)


def int_of(data: bytes | None) -> int | None:
    """A file holding one integer (None when missing or not an integer)."""
    if data is None:
        return None
    try:
        return int(data)
    except ValueError:
        return None


def usage_bytes_of(data: bytes | None) -> int | None:
    """A single-number file's value (`memory.usage_in_bytes`, `memory.current`); None when unreadable."""
    return int_of(data)


# memory.stat's LRU lists, in the kernel's order; v1's hierarchical totals (`total_` keys) are its last lines
_LRU = (b"inactive_anon", b"active_anon", b"inactive_file", b"active_file", b"unevictable")
_LRU_V1 = tuple(b"total_" + k for k in _LRU)
_LRU_WORDS = (list(_LRU_V1), list(_LRU))  # (v1, v2)
_LRU_START = (b"\n" + _LRU_V1[0] + b" ", b"\n" + _LRU[0] + b" ")
_INACTIVE_FILE = (b"\n" + _LRU_V1[2] + b" ", b"\n" + _LRU[2] + b" ")


def lru_of(stat: bytes, v2: bool) -> tuple[int, int, int, int, int]:
    """(inactive_anon, active_anon, inactive_file, active_file, unevictable) bytes of `memory.stat` (v1: the
    hierarchical `total_` keys); a missing or malformed key counts 0.

    The kernel prints the five on consecutive lines in this order (v1's totals are the file's last lines:
    searched from the end), so they are normally parsed from the ten words that start at the first; when those
    are not exactly the five keys with a number each, every key is searched for in the whole file.
    """
    keys = _LRU_WORDS[v2]
    start = _LRU_START[v2]
    i = stat.find(start) if v2 else stat.rfind(start)
    if i >= 0:
        # nine words and the rest: the last value is read to its line's end, as the per-key parse reads it
        # (a line `unevictable 12 34` is malformed there; split into words, it would read as 12)
        words = stat[i + 1 :].split(None, 9)
        if len(words) == 10 and words[0:10:2] == keys:
            try:
                inactive_anon, active_anon, inactive_file, active_file = map(int, words[1:9:2])
                rest = words[9]
                end = rest.find(b"\n")
                unevictable = int(rest[:end] if end >= 0 else rest)
                return inactive_anon, active_anon, inactive_file, active_file, unevictable
            except ValueError:
                pass
    inactive_anon, active_anon, inactive_file, active_file, unevictable = (
        stat_value_bytes(stat, key) or 0 for key in keys
    )
    return inactive_anon, active_anon, inactive_file, active_file, unevictable


def _inactive_file(stat: bytes, v2: bool) -> int:
    needle = _INACTIVE_FILE[v2]
    i = stat.find(needle) if v2 else stat.rfind(needle)
    if i < 0:
        return stat_value_bytes(stat, _LRU[2] if v2 else _LRU_V1[2]) or 0
    i += len(needle)
    end = stat.find(b"\n", i)
    try:
        return int(stat[i : end if end >= 0 else None])
    except ValueError:
        return 0


def working_set_of(usage: bytes | None, stat: bytes | None, v2: bool) -> int | None:
    """usage − inactive file pages (v1 `total_inactive_file`, v2 `inactive_file`), >= 0 (None: no usage)."""
    used = int_of(usage)
    if used is None:
        return None
    return max(0, used - _inactive_file(stat, v2)) if stat is not None else used


def memory_figures_of(
    usage: bytes | None, stat: bytes | None, v2: bool
) -> tuple[int, int | None, int | None] | None:
    """(working set, anon, anon + file pages) from the usage file and one `memory.stat` (the definitions of
    `CgroupReader.memory_readings`); anon and anon + file None without memory.stat; None without usage."""
    used = int_of(usage)
    if used is None:
        return None
    if stat is None:
        return used, None, None
    inactive_anon, active_anon, inactive_file, active_file, unevictable = lru_of(stat, v2)
    anon = inactive_anon + active_anon + unevictable
    return max(0, used - inactive_file), anon, anon + inactive_file + active_file


def memory_readings_of(usage: bytes | None, stat: bytes | None, v2: bool) -> MemoryReadings | None:
    """`memory_figures_of` as a MemoryReadings (see `CgroupReader.memory_readings`); None without usage."""
    figures = memory_figures_of(usage, stat, v2)
    return None if figures is None else MemoryReadings(*figures)
