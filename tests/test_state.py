"""NodeState reducer: pure, immutable, re-list semantics."""

from __future__ import annotations

from koordqos.events.types import (
    MetricTick,
    NodeSLOUpdated,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RuntimeContainer,
    RuntimeContainerUpserted,
    RuntimeSandbox,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    SourceSynced,
)
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState, reduce


def test_reducer_never_mutates_the_previous_state() -> None:
    s0 = NodeState()
    s1 = reduce(s0, PodUpserted(PodInfo(uid="a")))
    s2 = reduce(s1, PodDeleted("a"))
    assert dict(s0.pods) == {}
    assert set(s1.pods) == {"a"}
    assert dict(s2.pods) == {}
    assert (s0.generation, s1.generation, s2.generation) == (0, 1, 2)


def test_relist_replaces_only_pods_of_that_source() -> None:
    s = NodeState()
    s = reduce(s, PodUpserted(PodInfo(uid="gone")))
    s = reduce(s, PodUpserted(PodInfo(uid="kept")))
    s = reduce(s, PodUpserted(PodInfo(uid="local", source="nri")))
    s = reduce(s, PodsReplaced((PodInfo(uid="kept"), PodInfo(uid="new"))))
    assert set(s.pods) == {"kept", "new", "local"}


def test_removing_a_sandbox_forgets_its_containers() -> None:
    s = NodeState()
    s = reduce(s, RuntimeSandboxUpserted(RuntimeSandbox("sb", "uid", "p", "ns")))
    s = reduce(s, RuntimeContainerUpserted(RuntimeContainer("c1", "sb", "uid", "app")))
    s = reduce(s, RuntimeContainerUpserted(RuntimeContainer("c2", "other", "uid2", "app")))
    s = reduce(s, RuntimeSandboxRemoved("sb"))
    assert set(s.containers) == {"c2"}
    assert not s.sandboxes


def test_ticks_and_synced_sources_and_slo() -> None:
    s = reduce(NodeState(), MetricTick(at=5.0))
    assert s.last_tick is not None
    assert s.last_tick.at == 5.0
    s = reduce(s, SourceSynced("pods"))
    assert reduce(s, SourceSynced("pods")) is s  # no change, same object
    slo = NodeSLO()
    assert reduce(s, NodeSLOUpdated(slo)).node_slo is slo
    assert reduce(s, PodDeleted("missing")) is s


def test_runtime_synchronized_replaces_the_runtime_view_in_one_step() -> None:
    from koordqos.events.types import RuntimeSynchronized

    s = NodeState()
    s = reduce(s, RuntimeSandboxUpserted(RuntimeSandbox("stale", "u0", "p0", "ns")))
    s = reduce(s, RuntimeContainerUpserted(RuntimeContainer("stale-c", "stale", "u0", "app")))
    sbs = tuple(RuntimeSandbox(f"sb{i}", f"u{i}", f"p{i}", "ns") for i in range(1, 4))
    ctrs = tuple(RuntimeContainer(f"c{i}", f"sb{i}", f"u{i}", "app") for i in range(1, 4))
    s2 = reduce(s, RuntimeSynchronized(sbs, ctrs))
    assert set(s2.sandboxes) == {"sb1", "sb2", "sb3"}
    assert set(s2.containers) == {"c1", "c2", "c3"}
    assert s2.generation == s.generation + 1
    assert "stale" in s.sandboxes  # the previous snapshot is untouched
