"""The prediction server: the models trained from the report history, checkpointed to disk, and the
NodeMetric's `prodReclaimableMetric` / `prodPeakMetric` (docs/prediction.md, "Prediction rules the code refers
to").

* Start: wait until pods and the Node are synced, restore the checkpoints (known UIDs only; see
  docs/prediction.md for what happens to the other files), then run two loops.
* Training: at once, then a training interval after the previous round finished. One round reads, for every
  pod the agent knows, the P90 of its CPU and memory series over the last interval (`ReportHistory`, the
  collector's samples), and the node's; pods without samples are skipped ("Training round"). Sliced: the loop
  gets a turn every 100 pods.
* Every minute after the first round: drop models older than the expiration (and their files), then write
  the due checkpoints (≤ 12 a round, each model ≤ every 10 min), off the event loop.
* `fields(state, wall)`: the report's prediction fields, from the pods that have usage in the report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter, Gauge

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.events.types import Event, SourceSynced
from koordqos.model.pod import PodInfo
from koordqos.once import SeenOnce
from koordqos.prediction.checkpoint import (
    CheckpointDir,
    DirEntry,
    ModelCheckpoint,
    RestoreItem,
    encode,
    restore_plan,
)
from koordqos.prediction.histogram import HistogramError
from koordqos.prediction.model import (
    NS,
    ModelStore,
    PodUsage,
    PredictionParams,
    RoundSamples,
    TrainResult,
    checkpoint_due,
    known_uids,
    train_steps,
    window_p90,
)
from koordqos.prediction.predictors import MinPredictor, PredictError, Resources
from koordqos.report.format import cpu_quantity, memory_quantity
from koordqos.report.history import NODE_CPU, NODE_MEMORY, ReportHistory
from koordqos.state import NodeState

log = structlog.get_logger("koordqos.prediction")
Json = dict[str, Any]

_SOURCES = frozenset({"pods", "node"})
#: the GC and checkpoint loop's period (fixed in koordlet, no flag)
MAINTENANCE_SECONDS = 60.0
SAMPLES_PER_STEP = 50  # pods sampled per synchronous slice (~0.7 ms at 60-point windows)
PREDICT_PER_STEP = 25  # pods given to the predictors per slice (~0.5 ms)
RESTORE_PER_STEP = 10  # checkpoint files decoded and loaded per slice (~1 ms)

MODELS = Gauge("koordqos_prediction_models", "Prediction models held", registry=obs.REGISTRY)
MODEL_BYTES = Gauge(
    "koordqos_prediction_model_bytes", "Bytes of the prediction models' weight arrays", registry=obs.REGISTRY
)
CHECKPOINTS = Counter(
    "koordqos_prediction_checkpoints_total",
    "Checkpoint files handled, by outcome (written, restored, deleted, removed)",
    ["outcome"],
    registry=obs.REGISTRY,
)
CHECKPOINT_ERRORS = Counter(
    "koordqos_prediction_checkpoint_errors_total",
    "Checkpoint problems, by reason (invalid_file, load, scan, write, bound, remove)",
    ["reason"],
    registry=obs.REGISTRY,
)
TRAININGS = Counter(
    "koordqos_prediction_training_rounds_total", "Prediction training rounds", registry=obs.REGISTRY
)


def resource_json(values: Resources) -> Json:
    """A `ResourceMap` of milli-cores and bytes: `{"resources": {"cpu": "2489m", "memory": "4998039436"}}`."""
    return {"resources": {"cpu": cpu_quantity(values["cpu"]), "memory": memory_quantity(values["memory"])}}


def round_samples_steps(
    history: ReportHistory,
    pods: Iterable[PodInfo],
    now: float,
    window: float,
    per_step: int = SAMPLES_PER_STEP,
) -> Generator[None, None, RoundSamples]:
    """The training inputs at `now` (the history's clock): each pod's and the node's P90 over
    `[now − window, now]`; a pod missing CPU or memory samples there is left out (docs/prediction.md,
    "Training round")."""
    start = now - window
    out: list[PodUsage] = []
    for i, pod in enumerate(pods, 1):
        if i % per_step == 0:
            yield
        series = history.pods.get(pod.uid)
        if series is None:
            continue
        cpu = window_p90(series.cpu.window(start, now)[0])
        mem = window_p90(series.memory.window(start, now)[0])
        if cpu is None or mem is None:
            continue
        out.append(PodUsage(pod.uid, pod.priority_class.value, cpu, mem))
    node_cpu = window_p90(history.node[NODE_CPU].window(start, now)[0])
    node_mem = window_p90(history.node[NODE_MEMORY].window(start, now)[0])
    return RoundSamples(out, node_cpu, node_mem)


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What a restore did: models restored, files deleted, files skipped (corrupt or foreign), and the
    directory problem if it could not be read."""

    restored: int = 0
    deleted: int = 0
    skipped: int = 0
    error: str = ""


class PredictionServer:
    """The "prediction" component."""

    name = "prediction"
    essential = False

    def __init__(
        self,
        bus: EventBus,
        history: ReportHistory,
        params: PredictionParams | None = None,
        checkpoints: CheckpointDir | None = None,
        *,
        delete_invalid: bool = False,
        read_only: bool = False,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Any] = asyncio.sleep,
        offload: bool = True,
    ) -> None:
        self.bus = bus
        self.history = history
        self.params = params or PredictionParams()
        self.store = ModelStore(self.params)
        self.checkpoints = checkpoints
        self.delete_invalid = delete_invalid
        # `--dry-run`: checkpoints are read, never written or deleted (the agent changes nothing on the node)
        self.read_only = read_only
        self.wall = wall
        self.sleep = sleep
        self.offload = offload  # file I/O in a worker thread (tests may keep it on the loop)
        # after the first round: GC and checkpoints may run (docs/prediction.md, "Training round")
        self.trained = False
        self.last_train: TrainResult | None = None
        self.last_restore: RestoreResult | None = None
        self.checkpoint_writes = 0
        self._said: SeenOnce[str] = SeenOnce()
        self._sources = asyncio.Event()  # set once pods and the Node were synced
        bus.subscribe("prediction-sources", self._on_synced, SourceSynced)

    # -- helpers -------------------------------------------------------------------------------------------

    def _now_ns(self) -> int:
        return round(self.wall() * NS)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.offload:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def _problem(self, reason: str, key: str, msg: str, **kw: object) -> None:
        """Count a checkpoint problem; log it once per key."""
        CHECKPOINT_ERRORS.labels(reason).inc()
        obs.ERRORS.labels(self.name, reason).inc()
        if self._said.first(reason + ":" + key):
            log.warning(msg, **kw)

    def _gauges(self) -> None:
        MODELS.set(len(self.store))
        MODEL_BYTES.set(self.store.nbytes())

    # -- restore (docs/prediction.md, "Restore") -----------------------------------------------------------

    async def restore(self, state: NodeState | None = None, *, read_only: bool = False) -> RestoreResult:
        """Load the checkpoints of the UIDs known now; `read_only` (report --once, --dry-run) deletes
        nothing."""
        state = self.bus.state if state is None else state
        read_only = read_only or self.read_only
        cp = self.checkpoints
        if cp is None:
            self.last_restore = RestoreResult()
            return self.last_restore
        known = known_uids(state.pods.keys(), state.node is not None)
        try:
            names = cp.names()
        except FileNotFoundError as exc:
            self._no_directory(cp)
            self.last_restore = RestoreResult(error=str(exc))
            return self.last_restore
        except OSError as exc:
            self._problem(
                "scan", str(cp.path), "prediction checkpoints not restored", dir=str(cp.path), error=str(exc)
            )
            self.last_restore = RestoreResult(error=str(exc))
            return self.last_restore
        restored = deleted = skipped = 0
        doomed: list[str] = []
        # on the loop, RESTORE_PER_STEP files a step (read, decode: ~0.1 ms a file): a worker thread doing
        # this Python work would hold the GIL for whole switch intervals, stalling the loop as long
        for start in range(0, len(names), RESTORE_PER_STEP):
            if start:
                await asyncio.sleep(0)
            try:
                chunk = cp.read(names[start : start + RESTORE_PER_STEP])
            except OSError as exc:  # the directory went away meanwhile
                self._problem("scan", str(cp.path), "prediction checkpoints not restored", error=str(exc))
                break
            restored, skipped = self._restore_chunk(chunk, known, doomed, restored, skipped, read_only)
        if doomed and not read_only:
            deleted = await self._io(self._delete, doomed)
        self._gauges()
        CHECKPOINTS.labels("restored").inc(restored)
        self.last_restore = RestoreResult(restored, deleted, skipped)
        log.info(
            "prediction checkpoints restored",
            dir=str(cp.path),
            restored=restored,
            deleted=deleted,
            skipped=skipped,
        )
        return self.last_restore

    def _no_directory(self, cp: CheckpointDir) -> None:
        """A missing directory is a deployment without one (the chart creates it): no checkpoints, said once,
        not an error; written again once it exists."""
        if self._said.first("no-dir:" + str(cp.path)):
            log.info("prediction checkpoint directory missing: models kept in memory only", dir=str(cp.path))

    def _restore_chunk(
        self,
        chunk: Sequence[DirEntry],
        known: set[str],
        doomed: list[str],
        restored: int,
        skipped: int,
        read_only: bool,
    ) -> tuple[int, int]:
        cp = self.checkpoints
        assert cp is not None
        for item in restore_plan(chunk, known, delete_invalid=self.delete_invalid):
            if item.action == "restore" and item.checkpoint is not None:
                size = next((len(e.data or b"") for e in chunk if e.name == item.name), 0)
                self._load(item.checkpoint, size)
                restored += 1
                continue
            if item.invalid:
                self._problem(
                    "invalid_file",
                    item.name,
                    "prediction checkpoint file is not a readable checkpoint; "
                    + ("deleted" if item.action == "delete" and not read_only else "skipped"),
                    dir=str(cp.path),
                    file=item.name,
                    why=item.reason,
                )
            if item.action == "delete":
                doomed.append(item.name)
            else:
                skipped += 1
        return restored, skipped

    def _load(self, cp: ModelCheckpoint, size: int) -> None:
        model = self.store.new_model()
        # the file's save time (docs/prediction.md, "Checkpoint file")
        model.last_updated_ns = cp.last_updated_ns
        for what, hist, part in (("CPU", model.cpu, cp.cpu), ("Memory", model.memory, cp.memory)):
            try:
                if part is None:
                    raise HistogramError(f"no {what} histogram")
                hist.load(part)
            except HistogramError as exc:  # logged, the model kept (koordlet)
                self._problem(
                    "load",
                    cp.uid,
                    "prediction checkpoint partly loaded",
                    model=cp.uid,
                    part=what,
                    error=str(exc),
                )
        self.store.models[cp.uid] = model
        if self.checkpoints is not None:
            self.checkpoints.note(cp.uid, size)

    def _delete(self, names: Sequence[str]) -> int:
        cp = self.checkpoints
        assert cp is not None
        done = 0
        for name in names:
            try:
                if cp.remove(name):
                    done += 1
            except (OSError, ValueError) as exc:
                self._problem("remove", name, "prediction checkpoint not removed", file=name, error=str(exc))
        CHECKPOINTS.labels("deleted").inc(done)
        return done

    # -- training (docs/prediction.md, "Training round") ---------------------------------------------------

    async def train_round(self, state: NodeState | None = None) -> TrainResult:
        """One training round over the pods of `state` (default: the bus's), in slices."""
        state = self.bus.state if state is None else state
        t_ns = self._now_ns()
        now = self.history.clock()
        sampling = round_samples_steps(
            self.history, state.pods.values(), now, self.params.training_interval_seconds
        )
        samples: RoundSamples = await _drive(sampling)
        result: TrainResult = await _drive(train_steps(self.store, samples, t_ns))
        if result.refused and self._said.first(f"refused:{len(self.store)}"):
            log.warning(
                "prediction model bound reached; new pods are not modelled", bound=self.params.max_models
            )
        self.trained = True
        self.last_train = result
        TRAININGS.inc()
        self._gauges()
        return result

    # -- GC and checkpoints (docs/prediction.md, "Expiry", "Checkpoints") ----------------------------------

    async def gc_round(self) -> list[str]:
        """Drop expired models and their files."""
        if not self.trained:
            return []
        gone = self.store.expired(self._now_ns())
        for uid in gone:
            self.store.remove(uid)
        if gone and self.checkpoints is not None and not self.read_only:
            removed = await self._io(self._remove_files, gone)
            CHECKPOINTS.labels("removed").inc(removed)
        self._gauges()
        return gone

    def _remove_files(self, uids: Sequence[str]) -> int:
        cp = self.checkpoints
        assert cp is not None
        done = 0
        for uid in uids:
            try:
                if cp.remove(uid):
                    done += 1
                else:
                    log.debug("expired model had no checkpoint file", model=uid)
            except (OSError, ValueError) as exc:
                self._problem("remove", uid, "prediction checkpoint not removed", model=uid, error=str(exc))
        return done

    async def checkpoint_round(self) -> int:
        """Write the due checkpoints (each marked checkpointed even when its write failed, docs/prediction.md
        "Checkpoints")."""
        cp = self.checkpoints
        if not self.trained or cp is None or self.read_only:
            return 0
        if not await self._io(cp.path.is_dir):
            self._no_directory(cp)
            return 0
        now_ns = self._now_ns()
        items: list[tuple[str, bytes]] = []
        for uid in checkpoint_due(self.store, now_ns):
            model = self.store.models[uid]
            model.last_checkpointed_ns = now_ns
            items.append((uid, encode(uid, model.cpu.save(), model.memory.save(), now_ns)))
        if not items:
            return 0
        written: int = await self._io(self._write, items)
        self.checkpoint_writes += written
        CHECKPOINTS.labels("written").inc(written)
        return written

    def _write(self, items: Sequence[tuple[str, bytes]]) -> int:
        cp = self.checkpoints
        assert cp is not None
        done = 0
        for uid, data in items:
            try:
                cp.save(uid, data)
                done += 1
            except ValueError as exc:
                reason = "bound" if "bound" in str(exc) else "write"
                self._problem(
                    reason,
                    reason if reason == "bound" else uid,
                    "prediction checkpoint not written",
                    model=uid,
                    error=str(exc),
                )
            except OSError as exc:
                self._problem(
                    "write",
                    str(cp.path),
                    "prediction checkpoint not written",
                    model=uid,
                    dir=str(cp.path),
                    error=str(exc),
                )
        return done

    # -- the component -------------------------------------------------------------------------------------

    def _on_synced(self, event: Event, state: NodeState) -> None:
        if state.synced >= _SOURCES:
            self._sources.set()

    async def _synced(self) -> None:
        """Until pods and the Node were synced once (the known UIDs of a restore)."""
        if not self.bus.state.synced >= _SOURCES:
            await self._sources.wait()

    async def run(self) -> None:
        """Restore, then train every interval and maintain every minute, until cancelled."""
        await self._synced()
        await self.restore()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._training_loop())
            tg.create_task(self._maintenance_loop())

    async def _training_loop(self) -> None:
        while True:
            try:
                await self.train_round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                obs.ERRORS.labels(self.name, type(exc).__name__).inc()
                log.exception("prediction training round failed")
            await self.sleep(self.params.training_interval_seconds)

    async def _maintenance_loop(self) -> None:
        while True:
            try:
                await self.gc_round()
                await self.checkpoint_round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                obs.ERRORS.labels(self.name, type(exc).__name__).inc()
                log.exception("prediction GC/checkpoint round failed")
            await self.sleep(MAINTENANCE_SECONDS)

    # -- the report fields (docs/prediction.md, "Report") --------------------------------------------------

    def fields(
        self, state: NodeState, wall_now: float
    ) -> Callable[[Sequence[str]], Generator[None, None, Json]]:
        """The NodeMetric planner's hook: given the uids of the pods with usage in this report, the
        `prodReclaimableMetric` (always; `{"resource": {}}` when the prediction fails) and `prodPeakMetric`
        (only when it succeeds)."""

        def steps(uids: Sequence[str]) -> Generator[None, None, Json]:
            mp = MinPredictor(self.store.view, self.params, wall_now)
            pods: Mapping[str, PodInfo] = state.pods
            for i, uid in enumerate(uids, 1):
                if i % PREDICT_PER_STEP == 0:
                    yield
                pod = pods.get(uid)
                if pod is None:
                    continue
                try:
                    mp.add_pod(pod)
                except PredictError as exc:  # only logged (koordlet)
                    if self._said.first("pod:" + uid):  # a new pod until its first round: normal
                        log.debug("pod not predicted", pod=pod.key, reason=str(exc))
            try:
                prediction = mp.predict(state.node)
            except PredictError as exc:
                if self._said.first("predict:" + str(exc)):
                    log.info("prod reclaimable not predicted", reason=str(exc))
                return {"prodReclaimableMetric": {"resource": {}}}
            return {
                "prodReclaimableMetric": {"resource": resource_json(prediction.reclaimable)},
                "prodPeakMetric": {"resource": resource_json(prediction.peak)},
            }

        return steps

    def debug_state(self) -> Json:
        """Models, memory, the last rounds (for /debug/state)."""
        last, rest = self.last_train, self.last_restore
        cp = self.checkpoints
        return {
            "models": len(self.store),
            "modelBytes": self.store.nbytes(),
            "trained": self.trained,
            "lastTraining": None
            if last is None
            else {"updated": last.updated, "pods": last.pods, "refused": last.refused},
            "restore": None
            if rest is None
            else {
                "restored": rest.restored,
                "deleted": rest.deleted,
                "skipped": rest.skipped,
                "error": rest.error,
            },
            "checkpointDir": None if cp is None else str(cp.path),
            "checkpointBytes": None if cp is None else cp.used_bytes,
            "checkpointsWritten": self.checkpoint_writes,
        }


async def _drive(steps: Generator[None, None, Any]) -> Any:
    """Run a sliced generator, giving the loop a turn between slices; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)


__all__ = ["PredictionServer", "RestoreItem", "RestoreResult", "resource_json", "round_samples_steps"]
