"""The prediction models and one training round (docs/prediction.md, "Prediction rules the code refers to").

A model is a CPU and a memory `DecayingHistogram` keyed by a UID: one per pod (its uid), `__node__`, one
per priority class (`__node-koord-prod__` … `__node-__` for class "none") and `__node-sys__` (node minus
all pods).
Every training round adds one sample (weight 1, the round's time) per model: the P90 of the last
training-interval window of that pod's / the node's usage. A model not updated for longer than the
expiration is dropped. Pure: the caller reads the windows, the clock and the files.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from koordqos.prediction.histogram import CPU_LAYOUT, MEMORY_LAYOUT, DecayingHistogram

NS = 1_000_000_000
NODE_UID = "__node__"
SYS_UID = "__node-sys__"
#: the priority classes in koordlet's fixed order; "" is class "none"
CLASS_ORDER: tuple[str, ...] = ("koord-prod", "koord-mid", "koord-batch", "koord-free", "")
#: the percentiles a prediction holds
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p60", 0.6),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p98", 0.98),
    ("max", 1.0),
)
_PERCENTILE_OF = dict(PERCENTILES)
#: training slices: models updated per synchronous step (the caller may give the loop a turn between)
UPDATES_PER_STEP = 100


def class_uid(priority_class: str) -> str:
    """The UID of a priority class's model: `__node-koord-prod__`, … `__node-__`."""
    return f"__node-{priority_class}__"


CLASS_UIDS: tuple[str, ...] = tuple(class_uid(c) for c in CLASS_ORDER)
NODE_LEVEL_UIDS: tuple[str, ...] = (NODE_UID, SYS_UID, *CLASS_UIDS)
_NODE_LEVEL = frozenset(NODE_LEVEL_UIDS)  # always created: the bound applies to pod models


@dataclass(frozen=True, slots=True)
class PredictionParams:
    """koordlet's prediction flags and their defaults (seconds; docs/prediction.md, "Defaults")."""

    cold_start_seconds: float = 24 * 3600.0
    safety_margin_percent: int = 10
    memory_half_life_seconds: float = 24 * 3600.0
    cpu_half_life_seconds: float = 12 * 3600.0
    training_interval_seconds: float = 60.0
    model_expiration_seconds: float = 30 * 60.0
    checkpoint_interval_seconds: float = 10 * 60.0
    checkpoint_max_per_step: int = 12
    #: project bound: models kept at most (a node's pods plus the 7 node-level ones fit many times over)
    max_models: int = 4096


def seconds_ns(seconds: float) -> int:
    """Seconds → integer nanoseconds (Go durations are int64 ns)."""
    return round(seconds * NS)


@dataclass(frozen=True, slots=True)
class Estimate:
    """One percentile of a model: CPU in truncated milli-cores, memory in truncated bytes."""

    cpu_milli: int
    memory: int


Prediction = Mapping[str, Estimate]
"""p60, p90, p95, p98, max of one model."""


class Model:
    """CPU and memory histograms of one UID and when they were last updated / checkpointed (ns; 0 is the
    zero time: never)."""

    __slots__ = ("cpu", "last_checkpointed_ns", "last_updated_ns", "memory")

    def __init__(self, params: PredictionParams) -> None:
        self.cpu = DecayingHistogram(CPU_LAYOUT, seconds_ns(params.cpu_half_life_seconds))
        self.memory = DecayingHistogram(MEMORY_LAYOUT, seconds_ns(params.memory_half_life_seconds))
        self.last_updated_ns = 0
        self.last_checkpointed_ns = 0

    def update(self, cpu_cores: float, memory_bytes: float, t_ns: int) -> None:
        """One sample of weight 1 at `t_ns` in each histogram."""
        self.last_updated_ns = t_ns
        self.cpu.add(cpu_cores, 1.0, t_ns)
        self.memory.add(memory_bytes, 1.0, t_ns)

    def prediction(self) -> dict[str, Estimate]:
        """Each percentile as truncated milli-cores and bytes (docs/prediction.md, "Reading a model")."""
        return {
            key: Estimate(int(self.cpu.percentile(p) * 1000), int(self.memory.percentile(p)))
            for key, p in PERCENTILES
        }

    def nbytes(self) -> int:
        """Bytes of both weight arrays."""
        return self.cpu.nbytes() + self.memory.nbytes()


class ModelView(Mapping[str, Estimate]):
    """A model's percentiles computed when first read (the predictors read p95 and p98 only)."""

    __slots__ = ("_done", "_model")

    def __init__(self, model: Model) -> None:
        self._model = model
        self._done: dict[str, Estimate] = {}

    def __getitem__(self, key: str) -> Estimate:
        hit = self._done.get(key)
        if hit is None:
            p = _PERCENTILE_OF[key]  # KeyError for an unknown key, as a mapping should
            m = self._model
            hit = self._done[key] = Estimate(int(m.cpu.percentile(p) * 1000), int(m.memory.percentile(p)))
        return hit

    def __iter__(self) -> Iterator[str]:
        return iter(_PERCENTILE_OF)

    def __len__(self) -> int:
        return len(_PERCENTILE_OF)


class ModelStore:
    """The models by UID (koordlet's prediction server state)."""

    def __init__(self, params: PredictionParams | None = None) -> None:
        self.params = params or PredictionParams()
        self.models: dict[str, Model] = {}
        self.refused = 0  # new models not created because `max_models` were held

    def __len__(self) -> int:
        return len(self.models)

    def __contains__(self, uid: object) -> bool:
        return uid in self.models

    def new_model(self) -> Model:
        """An empty model with this store's half-lives."""
        return Model(self.params)

    def update(self, uid: str, cpu_cores: float, memory_bytes: float, t_ns: int) -> bool:
        """Create the model if missing, then add the sample; False when the store holds `max_models` and this
        is a new pod model (not created; the node-level models are always kept)."""
        model = self.models.get(uid)
        if model is None:
            if len(self.models) >= self.params.max_models and uid not in _NODE_LEVEL:
                self.refused += 1
                return False
            model = self.models[uid] = Model(self.params)
        model.update(cpu_cores, memory_bytes, t_ns)
        return True

    def prediction(self, uid: str) -> dict[str, Estimate] | None:
        """The model's percentiles, None when there is no model of that UID."""
        model = self.models.get(uid)
        return None if model is None else model.prediction()

    def view(self, uid: str) -> ModelView | None:
        """The model's percentiles computed as read (koordlet's `GetPrediction`), None without a model."""
        model = self.models.get(uid)
        return None if model is None else ModelView(model)

    def expired(self, now_ns: int) -> list[str]:
        """UIDs not updated for longer than the expiration (strictly longer, docs/prediction.md "Expiry")."""
        limit = seconds_ns(self.params.model_expiration_seconds)
        return [uid for uid, m in self.models.items() if now_ns - m.last_updated_ns > limit]

    def remove(self, uid: str) -> None:
        """Forget a model (no error when it is not there)."""
        self.models.pop(uid, None)

    def nbytes(self) -> int:
        """Bytes of all weight arrays (the models' memory without object overhead)."""
        return sum(m.nbytes() for m in self.models.values())


def checkpoint_due(store: ModelStore, now_ns: int) -> list[str]:
    """The UIDs one checkpoint round writes (docs/prediction.md, "Checkpoints"): oldest `last_checkpointed`
    first, stopping after `checkpoint_max_per_step` or at the first model checkpointed less than the interval
    ago."""
    interval = seconds_ns(store.params.checkpoint_interval_seconds)
    limit = store.params.checkpoint_max_per_step
    ordered = sorted(store.models.items(), key=lambda item: item[1].last_checkpointed_ns)
    out: list[str] = []
    for uid, model in ordered:
        if len(out) >= limit:
            break
        if model.last_checkpointed_ns and now_ns - model.last_checkpointed_ns < interval:
            break
        out.append(uid)
    return out


# -- one training round (docs/prediction.md, "Training round") -----------------------------------------------


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


_P90_32 = _float32(0.9)


def window_p90(values: Sequence[float]) -> float | None:
    """koordlet's P90 of a window: sorted, index floor(float32(n)·float32(0.9)) − 1 (≥ 0); None when empty."""
    n = len(values)
    if n == 0:
        return None
    index = max(math.floor(_float32(_float32(float(n)) * _P90_32)) - 1, 0)
    return sorted(values)[min(index, n - 1)]


@dataclass(frozen=True, slots=True)
class PodUsage:
    """A pod's P90 usage over the training window (cores, bytes) and its priority class."""

    uid: str
    priority_class: str
    cpu: float
    memory: float


@dataclass(frozen=True, slots=True)
class RoundSamples:
    """One round's inputs: the pods whose both queries succeeded, the node's (None: that query failed)."""

    pods: Sequence[PodUsage] = ()
    node_cpu: float | None = None
    node_memory: float | None = None


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What a round did: models updated, pods fed, new models refused (store full)."""

    updated: int
    pods: int
    refused: int


def train_steps(
    store: ModelStore, samples: RoundSamples, t_ns: int, per_step: int = UPDATES_PER_STEP
) -> Generator[None, None, TrainResult]:
    """One training round at `t_ns` in slices (yields after every `per_step` pod updates)."""
    sums = {c: [0.0, 0.0] for c in CLASS_ORDER}
    all_cpu = all_mem = 0.0
    contributed = False
    updated = refused = 0
    for i, pod in enumerate(samples.pods, 1):
        if store.update(pod.uid, pod.cpu, pod.memory, t_ns):
            updated += 1
        else:
            refused += 1
        acc = sums.get(pod.priority_class)
        if acc is not None:
            acc[0] += pod.cpu
            acc[1] += pod.memory
        all_cpu += pod.cpu
        all_mem += pod.memory
        contributed = True
        if i % per_step == 0:
            yield
    node_cpu = samples.node_cpu
    node_mem = samples.node_memory
    if node_cpu is not None and node_mem is not None:
        store.update(NODE_UID, node_cpu, node_mem, t_ns)
        updated += 1
    for cls in CLASS_ORDER:
        cpu, mem = sums[cls]
        store.update(class_uid(cls), cpu, mem, t_ns)
        updated += 1
    n_cpu = node_cpu if node_cpu is not None else 0.0
    n_mem = node_mem if node_mem is not None else 0.0
    if contributed:
        sys_cpu, sys_mem = max(n_cpu - all_cpu, 0.0), max(n_mem - all_mem, 0.0)
    else:
        sys_cpu, sys_mem = n_cpu, n_mem
    store.update(SYS_UID, sys_cpu, sys_mem, t_ns)
    updated += 1
    return TrainResult(updated, len(samples.pods), refused)


def train(store: ModelStore, samples: RoundSamples, t_ns: int) -> TrainResult:
    """`train_steps` in one go."""
    steps = train_steps(store, samples, t_ns)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: TrainResult = done.value
            return result


def known_uids(pod_uids: Iterable[str], node_known: bool) -> set[str]:
    """The UIDs a restore keeps (docs/prediction.md, "Restore"): current pods, `__node__` if the Node is
    known, sys, the classes."""
    out = set(pod_uids) | {SYS_UID, *CLASS_UIDS}
    if node_known:
        out.add(NODE_UID)
    return out
