"""SeenOnce: the bounded log-once memory every component uses."""

from __future__ import annotations

from koordqos.once import SeenOnce


def test_first_is_true_once_per_key() -> None:
    seen: SeenOnce[str] = SeenOnce()
    assert seen.first("a")
    assert not seen.first("a")
    assert seen.first("b")
    assert seen == {"a", "b"}


def test_memory_is_bounded_and_forgets_all_at_once() -> None:
    seen: SeenOnce[int] = SeenOnce(limit=3)
    assert all(seen.first(i) for i in range(3))
    assert seen.first(3)  # the limit was reached: the memory was dropped, then 3 remembered
    assert seen == {3}
    assert seen.first(0)  # forgotten keys are reported again


def test_retain_forgets_keys_that_no_longer_apply() -> None:
    seen: SeenOnce[tuple[str, str]] = SeenOnce()
    seen.first(("pod-a", "bad spec"))
    seen.first(("pod-b", "bad spec"))
    seen.retain(lambda k: k[0] == "pod-b")
    assert seen == {("pod-b", "bad spec")}
    assert seen.first(("pod-a", "bad spec"))
