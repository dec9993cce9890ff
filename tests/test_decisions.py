"""DecisionLog: a ring of the newest decisions, bounded in count and in the text each one keeps."""

from __future__ import annotations

import tracemalloc

from koordqos.decisions import FIELD_CHARS, DecisionLog


def test_the_ring_keeps_the_newest_decisions_in_order() -> None:
    log = DecisionLog(size=3)
    for i in range(5):
        log.record("s", f"t{i}", "write", old=i, new=i + 1, quiet=True)
    assert [d.target for d in log.recent()] == ["t2", "t3", "t4"]
    last = log.last()
    assert last is not None
    assert (last.old, last.new) == (4, 5)


def test_hostile_long_texts_are_cut_so_the_ring_stays_small() -> None:
    # pod and container names come from the runtime: 1,000 decisions about 64 KiB names would hold 64 MiB
    log = DecisionLog(size=1000)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(1000):
            name = f"{i:04d}" + "n" * 65_536
            target = f"ns/{name}/c"
            log.record("runtime-hooks", target, "nri-update", old=name, new=name, reason=name, quiet=True)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 1000 * (4 * FIELD_CHARS + 1024)
    d = log.recent()[-1]
    assert d.target.startswith("ns/0999nnn")  # what identifies it is kept
    assert len(d.target) == FIELD_CHARS
    assert isinstance(d.old, str)
    assert len(d.old) == FIELD_CHARS
    short = DecisionLog()
    short.record("s", "ns/pod/c", "write", old="1", new="2", reason="r", quiet=True)
    assert short.recent()[0].target == "ns/pod/c"  # the usual short texts are as given
