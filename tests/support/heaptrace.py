"""Run `python -m koordqos` with tracemalloc snapshots on SIGUSR1 and footprint reports on SIGUSR2.

    python -m tests.support.heaptrace OUT_PREFIX run --cgroup-root ...

Tracing starts at the first SIGUSR1, not at start-up: imports under tracemalloc take ~15x longer (protobuf
and grpc descriptors), and only what is allocated *after* a warm-up and still alive later is a leak. Every
SIGUSR1 (the first included, and the normal end of the process once tracing) writes `OUT_PREFIX.<n>.snap`, a
`tracemalloc.Snapshot`; `--diff A B` prints what grew between two of them by allocation traceback. The fuzz
bench uses it (`bench/fuzz.py --heap-profile DIR`). Tracing slows the agent down several times: never for
figures.

Every SIGUSR2 writes `OUT_PREFIX.footprint.<n>.json` (`footprint()`): RSS, pymalloc's arenas and blocks, and
the largest containers alive (dicts, sets, lists, deques, persistent maps) with their entry counts and the
bytes of what they hold, named by the module global or the attribute that refers to them. No tracing: cheap
enough to take at every 10 % of a fuzz run (`bench/fuzz.py --footprint DIR`).
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
import re
import runpy
import signal
import sys
import tempfile
import tracemalloc
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

# deep enough to see which caller of a generic container grew it; HEAPTRACE_FRAMES=1 traces ~3x faster
FRAMES = int(os.environ.get("HEAPTRACE_FRAMES", "12"))

#: containers with fewer entries than this are not listed in a footprint (their sum is)
MIN_ENTRIES = 64

_LEAVES = (str, bytes, bytearray, int, float, bool, complex, type(None))
_OPAQUE = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
)


def deep_size(obj: object, seen: set[int] | None = None, depth: int = 8) -> int:
    """Bytes of `obj` and of what it holds (containers, dataclass/slots instances), each object once.

    Modules, classes, functions and frames are not followed: they are not data a memo holds. `seen` is shared
    between calls to count a shared object once (e.g. the strings a memo and NodeState both hold)."""
    seen = set() if seen is None else seen
    stack = [(obj, depth)]
    total = 0
    while stack:
        o, d = stack.pop()
        if id(o) in seen or isinstance(o, _OPAQUE):
            continue
        seen.add(id(o))
        try:
            total += sys.getsizeof(o)
        except TypeError:
            continue
        if d <= 0 or isinstance(o, _LEAVES):
            continue
        for child in _children(o):
            stack.append((child, d - 1))
    return total


def _children(o: object) -> Iterable[object]:
    if isinstance(o, dict):
        yield from o.keys()
        yield from o.values()
        return
    if isinstance(o, (list, tuple, set, frozenset, collections.deque)):
        yield from o
        return
    if _is_container(o):  # an immutables.Map (the rest were handled above)
        for k, v in o.items():  # type: ignore[attr-defined]
            yield k
            yield v
        return
    yield from _attributes(o).values()


def _attributes(o: object) -> dict[str, object]:
    """An instance's attributes (its __dict__ and slots) without running any of its code."""
    out: dict[str, object] = {}
    try:
        d = object.__getattribute__(o, "__dict__")
    except Exception:
        d = None
    if isinstance(d, dict):
        out.update((str(k), v) for k, v in d.items())
    for klass in type(o).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            descr = klass.__dict__.get(slot)
            if isinstance(descr, types.MemberDescriptorType):
                try:
                    out[slot] = descr.__get__(o, type(o))
                except AttributeError:  # an unset slot
                    pass
    return out


def _is_container(o: object) -> bool:
    if isinstance(o, (dict, set, list, collections.deque)):
        return True
    return type(o).__name__ == "Map" and type(o).__module__.startswith("immutables")


def reachable() -> list[object]:
    """Every object reachable from the modules, the threads' frames and the gc-tracked objects.

    `gc.get_objects()` alone misses what `gc.freeze()` moved to the permanent generation (the agent freezes
    its start-up objects, module-level memos included), so the objects are found by following
    `gc.get_referents` from those roots."""
    roots: list[object] = [sys.modules, *sys._current_frames().values(), *gc.get_objects()]
    seen: set[int] = set()
    out: list[object] = []
    stack = roots
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        out.append(o)
        stack.extend(gc.get_referents(o))
    return out


def _names(objects: list[object]) -> dict[int, str]:
    """id(object) -> where it is referred from: `module.global` or `Class.attribute` (first found)."""
    names: dict[int, str] = {}
    for mod_name, mod in list(sys.modules.items()):
        try:  # without the module's own __getattr__: lazy modules import on attribute access
            namespace = object.__getattribute__(mod, "__dict__")
        except Exception:
            continue
        for attr, v in list(namespace.items()):
            names.setdefault(id(v), f"{mod_name}.{attr}")
    for o in objects:
        if isinstance(o, (*_OPAQUE, dict)):
            continue
        cls = type(o).__qualname__
        for attr, v in _attributes(o).items():
            names.setdefault(id(v), f"{cls}.{attr}")
    return names


def pymalloc_stats() -> dict[str, int]:
    """pymalloc's arena and block figures (`sys._debugmallocstats`, which writes to the C-level stderr)."""
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("ascii", "replace")
    out: dict[str, int] = {}
    for key in (
        "arenas allocated total",
        "arenas reclaimed",
        "arenas highwater mark",
        "arenas allocated current",
        "bytes in allocated blocks",
        "bytes in available blocks",
    ):
        m = re.search(r"# " + re.escape(key) + r"\s*=\s*([\d,]+)", text)
        if m:
            out[key.replace(" ", "_")] = int(m.group(1).replace(",", ""))
    m = re.search(r"(\d+) unused pools \*", text)
    if m:
        out["unused_pools"] = int(m.group(1))
    return out


def _rss_kib() -> int:
    return _status_kib().get("VmRSS", 0)


def _status_kib() -> dict[str, int]:
    """The process's memory lines of /proc/self/status (VmRSS, RssAnon, RssFile, …) in KiB."""
    out: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key.startswith(("Vm", "Rss")) and rest.strip().endswith("kB"):
                out[key] = int(rest.split()[0])
    return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_stats() -> dict[str, int]:
    """glibc's mallinfo2 (the C heap: objects over 512 bytes, C extensions' buffers); {} elsewhere."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {
        "heap_bytes": info.arena,  # from the system, not mmapped
        "mmapped_bytes": info.hblkhd,
        "in_use_bytes": info.uordblks,
        "free_bytes": info.fordblks,
        "top_releasable_bytes": info.keepcost,
    }


def allocators() -> dict[str, Any]:
    """The cheap part of a footprint (no walk over the objects, which itself moves the C heap): RSS lines,
    pymalloc and glibc figures. `HEAPTRACE_LIGHT=1` makes every SIGUSR2 report this only."""
    return {
        "rss_kib": _rss_kib(),
        "status_kib": _status_kib(),
        "malloc": malloc_stats(),
        "allocated_blocks": sys.getallocatedblocks(),
        "gc_objects": len(gc.get_objects()),
        "reachable_objects": 0,
        "pymalloc": pymalloc_stats(),
        "containers": [],
        "counters": _counters(),
        "types": [],
        "lru_caches": [],
    }


def footprint(top: int = 400, min_entries: int = MIN_ENTRIES) -> dict[str, Any]:
    """RSS, pymalloc figures, and the `top` containers of at least `min_entries` entries by the bytes they
    hold (each one counted on its own: what two containers share is in both)."""
    gc.collect()
    objects = reachable()
    names = _names(objects)
    report: list[dict[str, Any]] = []
    lru: list[dict[str, Any]] = []
    by_type: dict[str, list[int]] = {}
    for o in objects:
        cls = type(o)
        row = by_type.setdefault(f"{cls.__module__}.{cls.__qualname__}", [0, 0])
        row[0] += 1
        try:
            row[1] += sys.getsizeof(o)
        except TypeError:
            pass
        if cls.__name__ == "_lru_cache_wrapper":
            ci = o.cache_info()  # type: ignore[attr-defined]
            name = f"{getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', '?')}"
            lru.append({"name": name, "entries": ci.currsize, "max": ci.maxsize})
            continue
        if not _is_container(o):
            continue
        n = len(o)  # type: ignore[arg-type]
        if n < min_entries or (isinstance(o, dict) and _is_namespace(o)):
            continue
        report.append(
            {
                "name": names.get(id(o), "?"),
                "type": cls.__qualname__,
                "entries": n,
                "bytes": deep_size(o),
                "sample": _sample(o),
            }
        )
    count = len(objects)
    del objects
    report.sort(key=lambda r: -int(r["bytes"]))
    return allocators() | {
        "reachable_objects": count,
        "traced_bytes": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None,
        "containers": report[:top],
        "types": [[k, n, b] for k, (n, b) in sorted(by_type.items(), key=lambda kv: -kv[1][1])][:top],
        "lru_caches": sorted(lru, key=lambda r: -int(r["entries"]))[:top],
    }


#: metric families worth seeing next to the memory: queues past their bound, objects not kept
COUNTERS = ("koordqos_bus_backpressure", "koordqos_nri_untracked_objects", "koordqos_bus_coalesced")


def _counters() -> dict[str, float]:
    """The agent's counters of COUNTERS (name{labels} -> value), when the agent's registry is loaded."""
    obs = sys.modules.get("koordqos.observability")
    registry = getattr(obs, "REGISTRY", None)
    if registry is None:
        return {}
    out: dict[str, float] = {}
    for metric in registry.collect():
        if metric.name in COUNTERS:
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def _sample(o: object, n: int = 3, width: int = 300) -> list[str]:
    """The reprs of the last `n` entries of a container (the newest, for the ordered ones), cut to `width`."""
    try:
        items = list(o.items() if hasattr(o, "items") else o)[-n:]  # type: ignore[arg-type]
        return [repr(i)[:width] for i in items]
    except Exception as exc:  # a footprint never fails on what it looks at
        return [f"<{type(exc).__name__}>"]


def _is_namespace(d: dict[Any, Any]) -> bool:
    """A class's or module's attribute dict (not data)."""
    return "__module__" in d or "__name__" in d


def _dumper(prefix: str) -> tuple[Callable[[int, FrameType | None], None], Callable[[], None]]:
    count = 0
    reports = 0

    def dump() -> None:
        nonlocal count
        if not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
        snap = tracemalloc.take_snapshot()  # filtered when compared: filtering here takes minutes
        path = f"{prefix}.{count}.snap"
        snap.dump(path + ".part")
        os.replace(path + ".part", path)  # whole or absent: the bench waits for the name
        count += 1

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal reports
        if signum == signal.SIGUSR1:
            dump()
            return
        path = f"{prefix}.footprint.{reports}.json"
        reports += 1
        with open(path + ".part", "w", encoding="utf-8") as f:
            json.dump(allocators() if os.environ.get("HEAPTRACE_LIGHT") else footprint(), f)
        os.replace(path + ".part", path)

    return on_signal, dump


def diff(before: Path, after: Path, top: int = 25, key: str = "traceback") -> list[str]:
    """The `top` allocation sites that grew most from `before` to `after` (size, count, where)."""
    drop = (tracemalloc.Filter(False, tracemalloc.__file__),)
    old = tracemalloc.Snapshot.load(str(before)).filter_traces(drop)
    new = tracemalloc.Snapshot.load(str(after)).filter_traces(drop)
    lines = []
    for stat in new.compare_to(old, key)[:top]:
        lines.append(f"{stat.size_diff / 1024:+.1f} KiB  {stat.count_diff:+d} blocks")
        frames = stat.traceback.format(limit=FRAMES)
        lines.extend("    " + f for f in frames)
    return lines


def main() -> None:
    """`heaptrace PREFIX ARGS...`: the agent CLI with ARGS; `heaptrace --diff A B [KEY]`: compare dumps."""
    if len(sys.argv) >= 4 and sys.argv[1] == "--diff":  # --diff A B [traceback|lineno|filename]
        key = sys.argv[4] if len(sys.argv) > 4 else "traceback"
        print("\n".join(diff(Path(sys.argv[2]), Path(sys.argv[3]), key=key)))
        return
    prefix = sys.argv[1]
    on_signal, dump = _dumper(prefix)
    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGUSR2, on_signal)
    sys.argv = ["koordqos", *sys.argv[2:]]
    try:
        runpy.run_module("koordqos", run_name="__main__", alter_sys=True)
    finally:
        if tracemalloc.is_tracing():
            dump()


if __name__ == "__main__":
    main()
