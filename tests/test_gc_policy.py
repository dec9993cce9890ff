"""The agent process's garbage-collector policy (process.gcpolicy), each case in a fresh interpreter:
it freezes objects and switches automatic collection off for the whole process, which the rest of the suite
must not inherit. Structure, not timing: the pauses it saves are measured by bench/agent.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = """
import asyncio, gc, json
from types import SimpleNamespace
from koordqos.process.gcpolicy import GcPolicy
from koordqos.testing.poll import wait_until

async def main():
    reconciler = SimpleNamespace(passes=0)
    agent = SimpleNamespace(
        ready=False,
        parts=SimpleNamespace(reconciler=reconciler, nri=object()),
        bus=SimpleNamespace(state=SimpleNamespace(nri_connected=False)),
    )
    policy = GcPolicy(agent, mode={mode!r}, poll=0.001)
    out = {{"thresholds_before": list(gc.get_threshold())}}
    task = asyncio.create_task(policy.run())
    await wait_until(lambda: policy.polls >= 3, timeout=10, message="looked")
    out["frozen_before_ready"] = policy.freezes
    agent.ready = True
    agent.bus.state.nri_connected = True
    seen = policy.polls  # it looks at readiness right after counting a look: two more looks saw it
    await wait_until(lambda: policy.polls >= seen + 2, timeout=10, message="looked again")
    out["frozen_before_pass"] = policy.freezes
    reconciler.passes += 1  # the reconciler's first pass after the runtime synchronized
    await wait_until(lambda: policy.freezes >= 1, timeout=10, message="frozen once settled")
    out["freeze_count"] = gc.get_freeze_count()
    out["thresholds_while"] = list(gc.get_threshold())
    for _ in range(15 * gc.get_threshold()[0]):  # garbage cycles: ~15 automatic generation-0 collections
        c = []
        c.append(c)
    del c
    if {mode!r} == "paced":
        await wait_until(lambda: policy.collections[1] > 0, timeout=10, message="a paced collection")
    out["paced"] = list(policy.collections)
    before = policy.freezes
    gc.collect()  # a full collection: its survivors are frozen after it
    out["freezes_after_full"] = policy.freezes - before
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    out["thresholds_after"] = list(gc.get_threshold())
    print(json.dumps(out))

asyncio.run(main())
"""


def run_script(script: str, **values: object) -> dict[str, object]:
    """Run `script` (formatted with `values`) in a fresh interpreter; the JSON it prints."""
    code = textwrap.dedent(script).format(**values)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def run(mode: str) -> dict[str, object]:
    return run_script(SCRIPT, mode=mode)


def test_paced_freezes_once_settled_and_after_every_full_collection_and_collects_between_steps() -> None:
    got = run("paced")
    before = got["thresholds_before"]
    assert isinstance(before, list)
    assert got["frozen_before_ready"] == 0  # nothing frozen before start-up settled
    assert got["frozen_before_pass"] == 0  # ready and synchronized, but no reconciler pass since
    assert isinstance(got["freeze_count"], int)
    assert got["freeze_count"] > 0
    # the interpreter keeps collecting generation 0; generations 1 and 2 are the task's
    assert got["thresholds_while"] == [before[0], 1 << 30, 1 << 30]
    paced = got["paced"]
    assert isinstance(paced, list)
    assert paced[0] == 0
    assert paced[1] > 0  # generation-0 collections came due for a generation-1 one: the task ran it
    assert got["freezes_after_full"] >= 1
    assert got["thresholds_after"] == before  # given back as they were


def test_settle_keeps_automatic_collection() -> None:
    got = run("settle")
    assert isinstance(got["freeze_count"], int)
    assert got["freeze_count"] > 0
    assert got["thresholds_while"] == got["thresholds_before"]
    assert got["paced"] == [0, 0, 0]
    assert got["freezes_after_full"] >= 1
