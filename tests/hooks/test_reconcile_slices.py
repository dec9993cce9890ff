"""The reconciler's planner keeps its loop steps short at 1,000 pods / 2,000 containers (issue #18): it yields
before grouping the runtime containers by pod, groups them in slices, and does not group them again while the
runtime's containers mapping is the same. Structure, not timing: budgets are benchmarks."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from koordqos.events.types import RuntimeContainer, RuntimeSandbox, RuntimeSynchronized
from koordqos.hooks import reconcile_plan
from koordqos.hooks.podviews import CONTAINERS_PER_STEP
from koordqos.hooks.reconcile_plan import PassResult
from koordqos.state import NodeState, reduce

from .conftest import make_node, make_reconciler

PODS = 1000


def synchronized(pods: int = PODS) -> NodeState:
    """A NodeState after an NRI Synchronize of `pods` sandboxes with two containers each."""
    sandboxes = [
        RuntimeSandbox(f"sb{i}", f"uid{i}", f"pod{i}", "ns", cgroup_parent=f"/kubepods/besteffort/poduid{i}")
        for i in range(pods)
    ]
    containers = [
        RuntimeContainer(f"c{i}-{j}", f"sb{i}", f"uid{i}", f"ctr{j}", state="running")
        for i in range(pods)
        for j in range(2)
    ]
    return reduce(NodeState(), RuntimeSynchronized(tuple(sandboxes), tuple(containers)))


class CountingContainers(Mapping[str, RuntimeContainer]):
    """A containers mapping that counts the containers read through `values()`."""

    def __init__(self, inner: Mapping[str, RuntimeContainer]) -> None:
        self.inner = inner
        self.read = 0

    def __getitem__(self, key: str) -> RuntimeContainer:
        return self.inner[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)

    def values(self) -> Iterator[RuntimeContainer]:  # type: ignore[override]
        for c in self.inner.values():
            self.read += 1
            yield c


def test_the_planner_yields_before_grouping_2000_containers_and_groups_them_in_slices(tmp_path: Path) -> None:
    rec = make_reconciler(make_node(tmp_path))
    base = synchronized()
    counting = CountingContainers(base.containers)
    state = NodeState(sandboxes=base.sandboxes, containers=counting)
    steps = rec.planner.steps(state, PassResult())
    next(steps)
    assert counting.read == 0  # a turn for the loop before the grouping begins
    next(steps)
    assert counting.read == CONTAINERS_PER_STEP  # then one slice at a time
    rest = sum(1 for _ in steps)
    assert counting.read == 2 * PODS
    # the grouping's slices and then one stop per planned pod
    assert rest >= (2 * PODS) // CONTAINERS_PER_STEP - 1 + PODS


def test_the_same_runtime_containers_are_not_grouped_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    group = reconcile_plan.group_containers

    def counted(*args: object) -> Iterator[None]:
        nonlocal calls
        calls += 1
        return group(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(reconcile_plan, "group_containers", counted)
    rec = make_reconciler(make_node(tmp_path))
    state = synchronized(50)
    first = rec.compute(state)
    assert calls == 1
    again = rec.compute(state)
    assert calls == 1  # the reducer's persistent map did not change: the grouping is reused
    assert sorted(again.containers) == sorted(first.containers)
    assert len(first.containers) == 50 * 3  # two containers and the sandbox of every pod
    changed = reduce(state, RuntimeSynchronized(tuple(state.sandboxes.values()), ()))
    assert rec.compute(changed).containers == {f"uid{i}/containerd://sb{i}" for i in range(50)}
    assert calls == 2
