"""The slow-step detector (koordqos.loopwatch), each case in a fresh interpreter: installing it patches
asyncio's Handle for the whole process, which the rest of the suite must not inherit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from koordqos import loopwatch

SCRIPT = """
import asyncio, json, time
from prometheus_client import generate_latest
from koordqos import loopwatch, observability as obs

async def hog():
    await asyncio.sleep(0)
    time.sleep(0.03)  # the long step being measured (blocks the loop on purpose)
    await asyncio.sleep(0)

async def main():
    loop = asyncio.get_running_loop()
    {install}
    since = time.monotonic()
    await asyncio.create_task(hog(), name="hogger")
    for _ in range(5):
        await asyncio.sleep(0.01)
    print(json.dumps({{"snap": watch.snapshot(since), "metrics": generate_latest(obs.REGISTRY).decode()}}))

asyncio.run(main())
"""


def run(install: str) -> dict[str, object]:
    code = textwrap.dedent(SCRIPT).format(install=install)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_every_step_is_timed_and_the_longest_is_named() -> None:
    got = run("watch = loopwatch.install(loop)")
    snap = got["snap"]
    assert isinstance(snap, dict)
    assert snap["mode"] == "handle"
    assert snap["steps"] > 5
    longest = snap["longest_since"]
    assert longest["seconds"] >= 0.03
    # the task, its coroutine and where the step ended (the await after the blocking call)
    assert longest["name"].startswith("task hogger hog → hog:")
    assert "koordqos_loop_step_seconds_bucket" in got["metrics"]
    assert 'koordqos_loop_longest_step_seconds{step="task hogger hog' in got["metrics"]


def test_the_cpu_clock_leaves_out_the_time_the_loop_was_off_cpu() -> None:
    # the hog blocks in time.sleep: 30 ms by the wall clock, next to no CPU time
    got = run("watch = loopwatch.install(loop, env={'KOORDQOS_LOOP_WATCH': 'cpu'})")
    snap = got["snap"]
    assert isinstance(snap, dict)
    assert snap["clock"] == "cpu"
    assert snap["longest"]["seconds"] < 0.01  # by CPU time no step came near the 30 ms sleep
    assert 'koordqos_loop_longest_step_seconds{step="' in got["metrics"]


def test_the_probe_bounds_the_longest_step_on_a_loop_without_python_handles() -> None:
    got = run("watch = loopwatch.LoopWatch('probe'); loopwatch._start_probe(loop, watch, 0.002)")
    snap = got["snap"]
    assert isinstance(snap, dict)
    assert snap["mode"] == "probe"
    assert snap["longest_since"]["seconds"] >= 0.02  # the timer fired at least that late
    assert snap["longest_since"]["name"].startswith("? (probe timer")


def test_off_unless_the_environment_says_on() -> None:
    assert not loopwatch.enabled({})
    assert not loopwatch.enabled({loopwatch.ENV: "0"})
    assert loopwatch.enabled({loopwatch.ENV: "1"})
    assert loopwatch.current() is None  # nothing installed in this process


GC_SCRIPT = """
import asyncio, gc, json, time
from koordqos import loopwatch

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

async def hog():
    await asyncio.sleep(0)
    {body}
    await asyncio.sleep(0)

async def main():
    watch = loopwatch.install(asyncio.get_running_loop(), env={{"KOORDQOS_LOOP_WATCH": {setting!r}}})
    since = time.monotonic()
    await asyncio.create_task(hog(), name="hogger")
    for _ in range(5):
        await asyncio.sleep(0.01)
    print(json.dumps(watch.snapshot(since)))

asyncio.run(main())
"""


def run_gc(body: str, setting: str) -> dict[str, object]:
    code = textwrap.dedent(GC_SCRIPT).format(body=body, setting=setting)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_garbage_collections_are_timed_and_a_slow_steps_share_is_told() -> None:
    # a full collection over 200,000 fresh lists inside one step of the hogger
    snap = run_gc("junk = [[] for _ in range(200000)]; gc.collect(); del junk", "cpu")
    gcs = snap["gc"]
    assert isinstance(gcs, dict)
    assert gcs["2"]["count"] >= 1
    assert gcs["2"]["longest"] > 0
    full = [p for p in snap["gc_slow"] if p["generation"] == 2]  # type: ignore[union-attr]
    assert full
    hog = [s for s in snap["slow"] if s["name"].startswith("task hogger")]  # type: ignore[union-attr]
    assert hog
    assert hog[0]["gc"] >= full[-1]["seconds"]  # the collection ran inside that step


def test_the_stacks_mode_says_where_a_long_step_spent_its_time() -> None:
    snap = run_gc("spin(0.05)", "cpu,stacks")
    hog = [s for s in snap["slow"] if s["name"].startswith("task hogger")]  # type: ignore[union-attr]
    assert hog
    stacks = hog[0]["stacks"]
    assert stacks
    top, samples = stacks[0]
    assert top.startswith("spin:")  # the innermost frame first
    assert "hog:" in top
    assert samples > 1
