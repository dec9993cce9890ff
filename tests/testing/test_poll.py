"""The polling helper: returns once the condition holds, fails naming it when the deadline passes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from koordqos.testing.poll import ConditionTimeout, wait_until, wait_until_sync


async def test_returns_once_the_condition_holds() -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_soon(flag.set)
    await wait_until(flag.is_set, timeout=5, message="flag set")
    assert flag.is_set()


async def test_accepts_a_coroutine_predicate() -> None:
    calls = 0

    async def third_call() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3

    await wait_until(third_call, interval=0)
    assert calls == 3


async def test_times_out_with_the_condition_named() -> None:
    with pytest.raises(ConditionTimeout, match=r"timed out after 0.05 s waiting for the moon"):
        await wait_until(lambda: False, timeout=0.05, message="the moon")


async def test_a_timeout_is_an_assertion_error() -> None:
    with pytest.raises(AssertionError):
        await wait_until(lambda: False, timeout=0.01)


def test_sync_variant_waits_for_another_thread() -> None:
    done = threading.Event()
    threading.Thread(target=done.set).start()
    wait_until_sync(done.is_set, message="thread done")
    assert done.is_set()


def test_sync_variant_times_out_with_the_condition_named() -> None:
    with pytest.raises(ConditionTimeout, match="waiting for never"):
        wait_until_sync(lambda: False, timeout=0.02, message="never")


async def test_a_message_function_names_the_values_seen_last() -> None:
    seen = [0]

    def count() -> bool:
        seen[0] += 1
        return False

    with pytest.raises(ConditionTimeout) as err:
        await wait_until(count, timeout=0.05, interval=0, message=lambda: f"count at {seen[0]}")
    assert f"count at {seen[0]}" in str(err.value)
    assert seen[0] > 1  # not the value at the start of the wait
