"""SeenOnce: the bounded log-once memory every component uses."""

from __future__ import annotations

import tracemalloc

from koordqos.once import ENTRY_OVERHEAD, BoundedMemo, SeenOnce


def test_first_is_true_once_per_key() -> None:
    seen: SeenOnce[str] = SeenOnce()
    assert seen.first("a")
    assert not seen.first("a")
    assert seen.first("b")
    assert len(seen) == 2
    assert "a" in seen
    assert "b" in seen
    assert "c" not in seen


def test_memory_is_bounded_and_forgets_all_at_once() -> None:
    seen: SeenOnce[int] = SeenOnce(limit=3)
    assert all(seen.first(i) for i in range(3))
    assert seen.first(3)  # the limit was reached: the memory was dropped, then 3 remembered
    assert len(seen) == 1
    assert 3 in seen
    assert seen.first(0)  # forgotten keys are reported again


def test_retain_forgets_keys_that_no_longer_apply() -> None:
    seen: SeenOnce[tuple[str, str]] = SeenOnce(scoped=True)
    seen.first(("pod-a", "bad spec"), scope="pod-a")
    seen.first(("pod-b", "bad spec"), scope="pod-b")
    seen.first(("node", "no scope"))
    seen.retain_scopes(["pod-b"])
    assert ("pod-b", "bad spec") in seen
    assert ("node", "no scope") in seen  # no scope: kept
    assert len(seen) == 2
    assert seen.first(("pod-a", "bad spec"), scope="pod-a")


def test_discarded_keys_are_reported_again_and_free_their_room() -> None:
    seen: SeenOnce[str] = SeenOnce(limit=4)
    for i in range(100):  # far more first/discard cycles than the limit: never a wholesale clear
        assert seen.first(f"k{i}")
        seen.discard(f"k{i}")
        assert f"k{i}" not in seen
    assert seen.first("stays")
    for i in range(3):
        seen.first(f"other{i}")
    assert not seen.first("stays")  # 4 keys, the limit: still remembered
    assert len(seen) == 4


def test_many_large_hostile_keys_use_no_memory_beyond_the_fixed_table() -> None:
    # keys are pod ids, paths and error texts quoting hostile data: 10,000 distinct keys of 4 KiB each,
    # made and dropped one at a time as requests come, must leave nothing behind but the table allocated
    # when the SeenOnce was made (a set of the keys held up to 4,096 of them: 16 MiB)
    tracemalloc.start()
    try:
        seen: SeenOnce[str] = SeenOnce(4096)
        after_init, _ = tracemalloc.get_traced_memory()
        for i in range(10_000):
            seen.first(f"{i:08d}" + "x" * 4088)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after_init <= 64 * 1024 + 4096  # the table, allocated up front: 16 bytes a key by default
    assert current - after_init < 4096  # filling it allocates nothing that stays…
    assert peak - after_init < 4096 + 8192  # …and a clear drops the old table before it makes the new one


def test_a_bounded_memo_keeps_its_byte_budget_and_refuses_heavy_entries() -> None:
    memo: BoundedMemo[str, str] = BoundedMemo(budget=64 * 1024, max_entry=4096)
    for i in range(10_000):  # 10,000 distinct 1 KiB keys: ~20 MiB if all were kept
        key = f"{i:05d}" + "k" * 1019
        memo.put(key, key.upper(), len(key) * 2)
        assert memo.get(key) == key.upper()  # the entry just put is always there
        assert memo.weight <= 64 * 1024
    assert 0 < len(memo) <= 64 * 1024 // (2048 + ENTRY_OVERHEAD)
    heavy = "h" * 5000
    memo.put(heavy, heavy, len(heavy) * 2)
    assert memo.get(heavy) is None  # heavier than max_entry: computed every time, never kept
    assert heavy not in memo
