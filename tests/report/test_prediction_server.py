"""The prediction server: values survive a restart at once through the checkpoints; corrupt, foreign and
stale files; a missing directory; the byte bound; GC; the component's start (docs/prediction.md,
"Checkpoints", "Restore" and "Expiry")."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import MappingProxyType

from structlog.testing import capture_logs

from koordqos.bus import EventBus
from koordqos.events.types import SourceSynced
from koordqos.model.node import parse_node
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.prediction.checkpoint import CheckpointDir
from koordqos.prediction.model import NODE_UID, SYS_UID, PredictionParams
from koordqos.report.history import ReportHistory
from koordqos.report.prediction import CHECKPOINT_ERRORS, PredictionServer
from koordqos.state import NodeState
from koordqos.testing.poll import wait_until

from .conftest import FakeClock, GiB, snapshot

T0 = 1767225600.0
NODE = parse_node(
    {"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "8", "memory": "32Gi"},
                                           "allocatable": {"cpu": "8", "memory": "32Gi"}}}
)  # fmt: skip


def pod(uid: str, created: str = "2025-12-01T00:00:00Z") -> PodInfo:
    return parse_pod(
        {
            "metadata": {"uid": uid, "name": uid, "namespace": "ns", "creationTimestamp": created},
            "spec": {
                "priority": 9000,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}],
            },
            "status": {"phase": "Running"},
        }
    )


def state_of(*uids: str) -> NodeState:
    return NodeState(
        pods=MappingProxyType({u: pod(u) for u in uids}), node=NODE, synced=frozenset({"pods", "node"})
    )


class Rig:
    """A server over a synthetic history and wall clock."""

    def __init__(self, directory: Path, state: NodeState, **kw: object) -> None:
        self.clock = FakeClock(0.0)
        self.wall = [T0]
        self.history = ReportHistory(10.0, clock=self.clock)
        self.bus = EventBus(state=state)
        self.server = PredictionServer(
            self.bus,
            self.history,
            PredictionParams(),
            CheckpointDir(directory, **kw),  # type: ignore[arg-type]
            wall=lambda: self.wall[0],
            offload=False,
        )

    async def minutes(self, n: int, usage: dict[str, tuple[float, int]]) -> None:
        snap = snapshot(
            sum(c for c, _ in usage.values()) + 0.5, sum(m for _, m in usage.values()) + GiB, usage
        )
        for _ in range(n):
            for _ in range(6):
                self.clock.t += 10
                self.wall[0] += 10
                self.history.ingest(snap)
            await self.server.train_round()

    def fields(self) -> dict[str, object]:
        steps = self.server.fields(self.bus.state, self.wall[0])(list(self.bus.state.pods))
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return dict(done.value)


async def turns(n: int) -> None:
    """Give the loop `n` turns (the server's restore and first round take a few when nothing waits)."""
    for _ in range(n):
        await asyncio.sleep(0)


def errors(reason: str) -> float:
    return CHECKPOINT_ERRORS.labels(reason)._value.get()  # type: ignore[no-any-return]


async def test_values_survive_a_restart_at_once(tmp_path: Path) -> None:
    state = state_of("a", "b")
    before = Rig(tmp_path, state)
    usage = {"a": (1.0, 2 * GiB), "b": (0.25, GiB)}
    await before.minutes(30, usage)
    # a varying pod too: several buckets, quantised to 10000 in the file
    for cpu in (0.5, 1.5, 2.5, 3.5):
        await before.minutes(5, {**usage, "a": (cpu, 2 * GiB)})
    assert await before.server.checkpoint_round() == 9
    want = before.fields()
    assert "prodPeakMetric" in want
    after = Rig(tmp_path, state)
    after.wall[0] = before.wall[0] + 120  # restarted two minutes later, no training round yet
    result = await after.server.restore()
    assert (result.restored, result.deleted, result.skipped) == (9, 0, 0)
    assert after.fields() == want
    for uid in ("a", "b", NODE_UID, SYS_UID):
        assert after.server.store.prediction(uid) == before.server.store.prediction(uid), uid
    # restored models are rewritten by the first checkpoint rounds (never checkpointed since the start)
    after.server.trained = True
    assert await after.server.checkpoint_round() == 9


async def test_before_any_model_the_prediction_fails_empty(tmp_path: Path) -> None:
    rig = Rig(tmp_path, state_of("a"))
    assert rig.fields() == {"prodReclaimableMetric": {"resource": {}}}


async def test_corrupt_foreign_and_stale_files(tmp_path: Path) -> None:
    state = state_of("a")
    first = Rig(tmp_path, state_of("a", "gone"))
    await first.minutes(2, {"a": (1.0, GiB), "gone": (1.0, GiB)})
    assert await first.server.checkpoint_round() == 9
    (tmp_path / "a").write_bytes(b'{"UID": "a", "CPU": {"bucket')  # corrupt, of a known model
    (tmp_path / "notes.txt").write_text("someone else's file\n")  # foreign
    (tmp_path / "__node__.tmp").write_bytes(b"{")  # an interrupted write
    (tmp_path / "dir").mkdir()
    invalid = errors("invalid_file")
    rig = Rig(tmp_path, state)
    with capture_logs() as logs:
        result = await rig.server.restore()
    assert (result.restored, result.deleted, result.skipped) == (7, 2, 3)  # gone + .tmp deleted
    assert errors("invalid_file") == invalid + 3
    lines = [e for e in logs if "not a readable checkpoint" in e["event"]]
    assert sorted(e["file"] for e in lines) == ["a", "dir", "notes.txt"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["a", "notes.txt", "dir", NODE_UID, SYS_UID, *(f"__node-{c}__" for c in
         ("koord-prod", "koord-mid", "koord-batch", "koord-free", ""))]
    )  # fmt: skip
    assert "a" not in rig.server.store
    # the same files again: counted again, not logged again (one line per file)
    with capture_logs() as again:
        await Rig(tmp_path, state).server.restore()
    assert errors("invalid_file") == invalid + 6
    # a fresh server process logs afresh; within one process a file is logged once
    assert [e for e in again if "not a readable checkpoint" in e["event"]]
    with capture_logs() as third:
        await rig.server.restore()
    assert not [e for e in third if "not a readable checkpoint" in e["event"]]
    # the corrupt file of a known model is rewritten once it is trained
    await rig.minutes(1, {"a": (1.0, GiB)})
    await rig.server.checkpoint_round()
    assert (tmp_path / "a").read_bytes().startswith(b'{"UID":"a","CPU":')


async def test_koordlets_behaviour_deletes_invalid_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    rig = Rig(tmp_path, state_of("a"))
    rig.server.delete_invalid = True
    result = await rig.server.restore()
    assert result.deleted == 1
    assert os.listdir(tmp_path) == []


async def test_read_only_restore_deletes_nothing(tmp_path: Path) -> None:
    (tmp_path / "x.tmp").write_text("{")
    (tmp_path / "notes.txt").write_text("x")
    rig = Rig(tmp_path, state_of("a"))
    rig.server.delete_invalid = True
    await rig.server.restore(read_only=True)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "x.tmp"]


async def test_missing_directory_means_memory_only_until_it_exists(tmp_path: Path) -> None:
    """No directory (a deployment without the chart's mount): one info line, no errors, no write attempts;
    checkpoints are written once it exists."""
    rig = Rig(tmp_path / "missing", state_of("a"))
    scan, write = errors("scan"), errors("write")
    with capture_logs() as logs:
        result = await rig.server.restore()
        assert result.error
        await rig.minutes(1, {"a": (1.0, GiB)})
        assert await rig.server.checkpoint_round() == 0
    assert (errors("scan"), errors("write")) == (scan, write)
    assert [e["log_level"] for e in logs if "prediction" in e["event"]] == ["info"]
    (tmp_path / "missing").mkdir()
    assert await rig.server.checkpoint_round() == 8


async def test_an_unusable_directory_is_counted_never_fatal(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    rig = Rig(tmp_path / "file", state_of("a"))
    scan = errors("scan")
    with capture_logs() as logs:
        result = await rig.server.restore()
    assert result.error
    assert errors("scan") == scan + 1
    assert [e["log_level"] for e in logs if "prediction" in e["event"]] == ["warning"]
    await rig.minutes(1, {"a": (1.0, GiB)})
    assert await rig.server.checkpoint_round() == 0  # not a directory: nothing tried


async def test_the_byte_bound(tmp_path: Path) -> None:
    rig = Rig(tmp_path, state_of("a", "b"), max_bytes=1200)
    await rig.minutes(1, {"a": (1.0, GiB), "b": (2.0, GiB)})
    bound = errors("bound")
    written = await rig.server.checkpoint_round()
    assert 0 < written < 9
    assert errors("bound") == bound + 9 - written
    assert sum(os.stat(tmp_path / name).st_size for name in os.listdir(tmp_path)) <= 1200


async def test_gc_removes_expired_models_and_files(tmp_path: Path) -> None:
    rig = Rig(tmp_path, state_of("a", "b"))
    await rig.minutes(1, {"a": (1.0, GiB), "b": (1.0, GiB)})
    await rig.server.checkpoint_round()
    assert (tmp_path / "b").exists()
    # b has no samples any more: its last update was the next round (the window [t − 1 min, t] holds the
    # previous round's last point); 30 min after that it is not yet expired, a minute later it is
    await rig.minutes(31, {"a": (1.0, GiB)})
    assert await rig.server.gc_round() == []
    await rig.minutes(1, {"a": (1.0, GiB)})
    assert await rig.server.gc_round() == ["b"]
    assert not (tmp_path / "b").exists()
    assert "b" not in rig.server.store


async def test_the_component_restores_then_trains(tmp_path: Path) -> None:
    before = Rig(tmp_path, state_of("a"))
    await before.minutes(3, {"a": (1.0, GiB)})
    await before.server.checkpoint_round()
    rig = Rig(tmp_path, NodeState(pods=state_of("a").pods, node=NODE))  # pods/node not synced yet
    bus = asyncio.create_task(rig.bus.run())
    task = asyncio.create_task(rig.server.run())
    try:
        await turns(50)
        assert rig.server.last_restore is None  # waits for the sources
        await rig.bus.publish(SourceSynced("pods"))
        await turns(50)
        assert rig.server.last_restore is None  # the Node too
        await rig.bus.publish(SourceSynced("node"))
        await wait_until(lambda: rig.server.trained, message="first training round")
        assert rig.server.last_restore is not None
        assert rig.server.last_restore.restored == 8
        assert rig.server.debug_state()["models"] == 8
    finally:
        task.cancel()
        bus.cancel()
        await asyncio.gather(task, bus, return_exceptions=True)


async def test_dry_run_reads_the_checkpoints_and_writes_none(tmp_path: Path) -> None:
    before = Rig(tmp_path, state_of("a", "gone"))
    await before.minutes(2, {"a": (1.0, GiB), "gone": (1.0, GiB)})
    assert await before.server.checkpoint_round() == 9
    files = sorted(os.listdir(tmp_path))
    rig = Rig(tmp_path, state_of("a"))
    rig.server.read_only = True
    result = await rig.server.restore()
    assert (result.restored, result.deleted) == (8, 0)  # "gone"'s file is not deleted
    await rig.minutes(40, {"a": (1.0, GiB)})
    assert await rig.server.checkpoint_round() == 0
    rig.server.store.models["a"].last_updated_ns = 0  # expired: dropped from memory, its file kept
    assert await rig.server.gc_round() == ["a"]
    assert sorted(os.listdir(tmp_path)) == files
