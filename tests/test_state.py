"""NodeState reducer: pure, immutable, re-list semantics."""

from __future__ import annotations

from types import MappingProxyType

from immutables import Map

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
from koordqos.model.node import NodeInfo
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


# -- the persistent maps: property tests against a plain-dict model of the old reducer -----------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from koordqos.events.types import Event, RuntimeContainerRemoved, RuntimeSynchronized  # noqa: E402

_IDS = st.sampled_from([f"c{i}" for i in range(12)])
_SBS = st.sampled_from([f"sb{i}" for i in range(4)])
_container = st.builds(
    RuntimeContainer, id=_IDS, sandbox_id=_SBS, pod_uid=st.just("u"), name=st.sampled_from(["a", "b"])
)
_sandbox = st.builds(RuntimeSandbox, id=_SBS, uid=st.just("u"), name=st.just("p"), namespace=st.just("ns"))
_event: st.SearchStrategy[Event] = st.one_of(
    st.builds(RuntimeContainerUpserted, _container),
    st.builds(RuntimeContainerRemoved, _IDS),
    st.builds(RuntimeSandboxUpserted, _sandbox),
    st.builds(RuntimeSandboxRemoved, _SBS),
    st.builds(PodUpserted, st.builds(PodInfo, uid=st.sampled_from(["u1", "u2", "u3"]))),
    st.builds(PodDeleted, st.sampled_from(["u1", "u2", "u9"])),
    st.builds(
        RuntimeSynchronized,
        st.lists(_sandbox, max_size=3).map(tuple),
        st.lists(_container, max_size=6).map(tuple),
    ),
)


def _model(
    model: tuple[dict[str, PodInfo], dict[str, RuntimeSandbox], dict[str, RuntimeContainer]], event: Event
) -> None:
    """The reducer's semantics on plain dicts (what NodeState did before its maps were persistent)."""
    pods, sandboxes, containers = model
    match event:
        case RuntimeContainerUpserted(container=c):
            containers[c.id] = c
        case RuntimeContainerRemoved(id=cid):
            containers.pop(cid, None)
        case RuntimeSandboxUpserted(sandbox=sb):
            sandboxes[sb.id] = sb
        case RuntimeSandboxRemoved(id=sid):
            sandboxes.pop(sid, None)
            for cid in [k for k, c in containers.items() if c.sandbox_id == sid]:
                del containers[cid]
        case PodUpserted(pod=p):
            pods[p.uid] = p
        case PodDeleted(uid=uid):
            pods.pop(uid, None)
        case RuntimeSynchronized(sandboxes=sbs, containers=ctrs):
            sandboxes.clear()
            sandboxes.update({s.id: s for s in sbs})
            containers.clear()
            containers.update({c.id: c for c in ctrs})


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=40))
def test_persistent_maps_behave_like_dicts_and_keep_every_snapshot(events: list[Event]) -> None:
    model: tuple[dict[str, PodInfo], dict[str, RuntimeSandbox], dict[str, RuntimeContainer]] = ({}, {}, {})
    history: list[tuple[NodeState, dict[str, RuntimeContainer], dict[str, RuntimeSandbox]]] = []
    s = NodeState()
    for ev in events:
        s = reduce(s, ev)
        _model(model, ev)
        pods, sandboxes, containers = model
        assert dict(s.pods) == pods
        assert dict(s.sandboxes) == sandboxes
        assert dict(s.containers) == containers
        # the per-sandbox index agrees with a scan, for every sandbox id (also unknown ones)
        for sid in ("sb0", "sb1", "sb2", "sb3", "none"):
            want = {k: c for k, c in containers.items() if c.sandbox_id == sid}
            assert dict(s.containers_of(sid)) == want
        index = s.by_sandbox if s.by_sandbox is not None else Map()  # None: not needed yet
        assert all(group for group in index.values())  # no empty groups kept
        history.append((s, dict(containers), dict(sandboxes)))
    for snap, containers, sandboxes in history:  # every older snapshot is exactly as it was
        assert dict(snap.containers) == containers
        assert dict(snap.sandboxes) == sandboxes


def test_states_built_from_plain_mappings_are_reduced_like_persistent_ones() -> None:
    c1 = RuntimeContainer("c1", "sb", "u", "a")
    c2 = RuntimeContainer("c2", "sb2", "u", "a")
    s = NodeState(containers=MappingProxyType({"c1": c1, "c2": c2}), pods={"p": PodInfo(uid="p")})
    assert dict(s.containers_of("sb")) == {"c1": c1}  # without the index: a scan
    s2 = reduce(s, RuntimeSandboxRemoved("sb"))
    assert dict(s2.containers) == {"c2": c2}
    assert isinstance(s2.containers, Map)
    s3 = reduce(s2, PodDeleted("p"))
    assert dict(s3.pods) == {}
    assert dict(s.pods) == {"p": PodInfo(uid="p")}


def test_a_container_that_moves_to_another_sandbox_leaves_the_old_group() -> None:
    s = reduce(NodeState(), RuntimeContainerUpserted(RuntimeContainer("c", "sb1", "u", "a")))
    s = reduce(s, RuntimeContainerUpserted(RuntimeContainer("c", "sb2", "u", "a")))
    assert dict(s.containers_of("sb1")) == {}
    assert set(s.containers_of("sb2")) == {"c"}
    s = reduce(s, RuntimeSandboxRemoved("sb1"))
    assert set(s.containers) == {"c"}


def test_removing_something_unknown_still_counts_a_generation() -> None:
    s = NodeState()
    assert reduce(s, RuntimeContainerRemoved("nope")).generation == 1
    assert reduce(s, RuntimeSandboxRemoved("nope")).generation == 1


def test_evolve_copies_every_field_and_changes_only_the_given_ones() -> None:
    from dataclasses import fields, replace

    from koordqos.state import _evolve

    base = reduce(NodeState(), RuntimeContainerUpserted(RuntimeContainer("c", "sb", "u", "a")))
    base = reduce(base, SourceSynced("pods"))
    # a value of each field's own type that differs from base's (the compiled build checks the types)
    other_ctr = RuntimeContainer("d", "sb2", "u2", "b")
    other = {
        "pods": Map({"p": PodInfo(uid="p")}),
        "node": NodeInfo(name="n1"),
        "node_slo": NodeSLO(),
        "sandboxes": Map({"sb2": RuntimeSandbox("sb2", "u2", "p", "ns")}),
        "containers": Map({"d": other_ctr}),
        "synced": frozenset({"nri"}),
        "nri_connected": True,
        "last_tick": MetricTick(at=1.0),
        "generation": 99,
        "by_sandbox": Map({"sb2": Map({"d": other_ctr})}),
        "volume_claims": Map({"default/c": "pv-c"}),
    }
    assert sorted(other) == sorted(f.name for f in fields(NodeState))
    for f in fields(NodeState):
        changed = _evolve(base, {f.name: other[f.name]})
        assert changed == replace(base, **{f.name: other[f.name]})
        assert changed != base
        assert getattr(changed, f.name) is other[f.name]
        assert all(getattr(changed, g.name) is getattr(base, g.name) for g in fields(NodeState) if g != f)
        assert _evolve(base, {}) == base
