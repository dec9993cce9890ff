"""The models and the training round (docs/prediction.md, "Training round", "Expiry" and "Checkpoints";
koordlet's prediction-server test vector)."""

from __future__ import annotations

import pytest

from koordqos.prediction.histogram import MEMORY_LAYOUT
from koordqos.prediction.model import (
    CLASS_UIDS,
    NODE_UID,
    SYS_UID,
    ModelStore,
    PodUsage,
    PredictionParams,
    RoundSamples,
    checkpoint_due,
    class_uid,
    train,
    train_steps,
    window_p90,
)

MiB = 1 << 20
MIN_NS = 60 * 10**9
T0 = 1767225600 * 10**9


def first_round(store: ModelStore, t: int = T0) -> None:
    """koordlet's prediction-server vector: node CPU 0 / 256 MiB; pod1 1 core / 128 MiB, pod2 3 cores / 128
    MiB, both BestEffort → batch."""
    train(
        store,
        RoundSamples(
            [
                PodUsage("pod1", "koord-batch", 1.0, 128 * MiB),
                PodUsage("pod2", "koord-batch", 3.0, 128 * MiB),
            ],
            0.0,
            256 * MiB,
        ),
        t,
    )


def test_one_round_makes_nine_models() -> None:
    store = ModelStore()
    first_round(store)
    assert sorted(store.models) == sorted(["pod1", "pod2", NODE_UID, SYS_UID, *CLASS_UIDS])
    node = store.prediction(NODE_UID)
    assert node is not None
    assert node["p90"].cpu_milli == 25  # an all-zero CPU histogram: the end of bucket 0
    assert node["p90"].memory == 286623669
    batch = store.prediction(class_uid("koord-batch"))
    assert batch is not None
    assert batch["max"].cpu_milli == 4217
    sys = store.prediction(SYS_UID)
    assert sys is not None
    assert sys["p95"].cpu_milli == 25
    assert sys["p98"].memory == 5242880  # max(256 − 256 MiB, 0)


def test_a_hundred_simultaneous_rounds() -> None:
    store = ModelStore()
    first_round(store)
    for cpu in range(2, 101):
        train(
            store, RoundSamples([PodUsage("pod1", "koord-batch", float(cpu), 128 * MiB)], 0.0, 256 * MiB), T0
        )
    pod1 = store.prediction("pod1")
    assert pod1 is not None
    assert pod1["p90"].cpu_milli == 92017
    assert pod1["max"].cpu_milli == 101500
    assert pod1["p60"].cpu_milli == 62119


def test_no_pods_makes_seven_models_and_gc_takes_them() -> None:
    store = ModelStore()
    train(store, RoundSamples([], 1.0, 1024 * MiB), T0)
    assert len(store) == 7
    assert store.expired(T0 + 30 * MIN_NS) == []  # not strictly older
    assert sorted(store.expired(T0 + 31 * MIN_NS)) == sorted([NODE_UID, SYS_UID, *CLASS_UIDS])


def test_failed_node_query_still_trains_sys_and_classes() -> None:
    """Training round steps 2–4 (docs/prediction.md, "Training round"): no `__node__` update, sys gets max(0 −
    Σ pods, 0) = 0."""
    store = ModelStore()
    train(store, RoundSamples([PodUsage("p", "koord-prod", 2.0, 10 * MiB)], None, 512 * MiB), T0)
    assert NODE_UID not in store
    sys = store.prediction(SYS_UID)
    assert sys is not None
    assert sys["max"].cpu_milli == 25
    assert sys["max"].memory == int(MEMORY_LAYOUT.start(MEMORY_LAYOUT.find(502 * MiB) + 1))
    prod = store.prediction(class_uid("koord-prod"))
    assert prod is not None
    assert prod["max"].cpu_milli == 2001


def test_no_pod_sys_is_the_node() -> None:
    store = ModelStore()
    train(store, RoundSamples([], 1.3, 3 << 30), T0)
    sys, node = store.prediction(SYS_UID), store.prediction(NODE_UID)
    assert sys is not None
    assert sys == node


def test_training_in_slices_gives_the_same_models() -> None:
    pods = [PodUsage(f"p{i}", "koord-prod", 0.1 * i, i * MiB) for i in range(250)]
    one, sliced = ModelStore(), ModelStore()
    train(one, RoundSamples(pods, 30.0, 1 << 34), T0)
    steps = train_steps(sliced, RoundSamples(pods, 30.0, 1 << 34), T0, per_step=100)
    n = 0
    while True:
        try:
            next(steps)
            n += 1
        except StopIteration:
            break
    assert n == 2
    assert {u: one.prediction(u) for u in one.models} == {u: sliced.prediction(u) for u in sliced.models}


def test_the_model_bound_keeps_node_level_models() -> None:
    store = ModelStore(PredictionParams(max_models=8))
    train(store, RoundSamples([PodUsage("p0", "koord-prod", 1.0, MiB)], 1, 1), T0)
    assert len(store) == 8
    more = RoundSamples([PodUsage(f"p{i}", "koord-prod", 1.0, MiB) for i in range(3)], 1, 1)
    result = train(store, more, T0 + MIN_NS)
    assert result.refused == 2
    assert len(store) == 8
    assert store.refused == 2
    assert all(u in store for u in (NODE_UID, SYS_UID, *CLASS_UIDS))


@pytest.mark.parametrize(("n", "index"), [(1, 0), (2, 0), (10, 8), (60, 53), (2000, 1799)])
def test_window_p90_index(n: int, index: int) -> None:
    values = [float(i) for i in reversed(range(n))]
    assert window_p90(values) == float(index)


def test_window_p90_empty() -> None:
    assert window_p90([]) is None


# -- checkpoint rounds (docs/prediction.md, "Checkpoints") ---------------------------------------------------


def three_models() -> ModelStore:
    store = ModelStore()
    for uid in ("a", "b", "c"):
        store.update(uid, 1.0, MiB, T0)
    return store


def written(store: ModelStore, now: int) -> int:
    due = checkpoint_due(store, now)
    for uid in due:
        store.models[uid].last_checkpointed_ns = now
    return len(due)


def test_checkpoint_rounds_every_ten_minutes() -> None:
    store = three_models()
    assert written(store, T0) == 3
    assert written(store, T0 + 5 * MIN_NS) == 0
    assert written(store, T0 + 11 * MIN_NS) == 3


def test_checkpoint_round_limit() -> None:
    store = ModelStore(PredictionParams(checkpoint_max_per_step=1))
    for uid in ("a", "b", "c"):
        store.update(uid, 1.0, MiB, T0)
    assert written(store, T0) == 1
    assert written(store, T0 + 1) == 1  # the next never-written one (zero time first)


def test_checkpoint_round_stops_at_the_first_recent_model() -> None:
    """The loop breaks, it does not skip (docs/prediction.md, "Checkpoints")."""
    store = three_models()
    store.models["a"].last_checkpointed_ns = T0 - 11 * MIN_NS
    store.models["b"].last_checkpointed_ns = T0 - 5 * MIN_NS
    store.models["c"].last_checkpointed_ns = T0 - 20 * MIN_NS
    assert checkpoint_due(store, T0) == ["c", "a"]
