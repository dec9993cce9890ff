"""heaptrace: the footprint report finds what holds memory, frozen module-level memos included."""

from __future__ import annotations

import gc
import sys
import types

from tests.support.heaptrace import deep_size, footprint, malloc_stats, pymalloc_stats


def test_deep_size_counts_what_a_container_holds_once() -> None:
    text = "x" * 10_000
    held = {f"k{i}": "v" * 1_000 + str(i) for i in range(100)}
    assert deep_size(held) > 100 * 1_000
    shared = [text, text, text]
    assert deep_size(shared) < 2 * 10_000  # the same string, counted once


def test_footprint_names_a_frozen_module_level_memo_and_its_bytes() -> None:
    mod = types.ModuleType("kq_footprint_probe")
    mod.MEMO = {f"hostile-{i}": f"{i}" + "y" * 2_000 for i in range(300)}  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    gc.collect()
    gc.freeze()  # as the agent does after start-up: gc.get_objects() no longer lists the memo
    try:
        assert not any(o is mod.MEMO for o in gc.get_objects())  # type: ignore[attr-defined]
        report = footprint()
    finally:
        gc.unfreeze()
        del sys.modules[mod.__name__]
    rows = [c for c in report["containers"] if c["name"] == "kq_footprint_probe.MEMO"]
    assert len(rows) == 1
    assert rows[0]["entries"] == 300
    assert rows[0]["bytes"] > 300 * 2_000
    assert report["rss_kib"] > 0
    assert report["pymalloc"]["arenas_allocated_current"] > 0


def test_allocator_figures() -> None:
    pm = pymalloc_stats()
    assert pm["bytes_in_allocated_blocks"] > 0
    m = malloc_stats()  # glibc here; {} where mallinfo2 is missing
    assert not m or m["in_use_bytes"] > 0
