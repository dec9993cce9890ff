"""Run `python -m koordqos` with tracemalloc snapshots on SIGUSR1 (leak hunting).

    python -m koordqos.testing.heaptrace OUT_PREFIX run --cgroup-root ...

Tracing starts at the first SIGUSR1, not at start-up: imports under tracemalloc take ~15x longer (protobuf
and grpc descriptors), and only what is allocated *after* a warm-up and still alive later is a leak. Every
SIGUSR1 (the first included, and the normal end of the process once tracing) writes `OUT_PREFIX.<n>.snap`, a
`tracemalloc.Snapshot`; `--diff A B` prints what grew between two of them by allocation traceback. The fuzz
bench uses it (`bench/fuzz.py --heap-profile DIR`). Tracing slows the agent down several times: never for
figures.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType

FRAMES = 12  # deep enough to see which caller of a generic container grew it


def _dumper(prefix: str) -> tuple[Callable[[], None], Callable[[int, FrameType | None], None]]:
    count = 0

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
        dump()

    return dump, on_signal


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
    dump, on_signal = _dumper(prefix)
    signal.signal(signal.SIGUSR1, on_signal)
    sys.argv = ["koordqos", *sys.argv[2:]]
    try:
        runpy.run_module("koordqos", run_name="__main__", alter_sys=True)
    finally:
        if tracemalloc.is_tracing():
            dump()


if __name__ == "__main__":
    main()
