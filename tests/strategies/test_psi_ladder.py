"""The PSI interference ladder, pure: engage, climb, hold in the band, restore after clean rounds and the
cooldown, and no flapping at the threshold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.strategies.psi_ladder import (
    Action,
    LadderSettings,
    LadderState,
    Observation,
    Room,
    Rung,
    classify,
    step,
)

CFG = LadderSettings(
    pod_threshold=0.10,
    node_threshold=0.20,
    clear_ratio=0.5,
    trigger_rounds=3,
    clear_rounds=4,
    cooldown_seconds=30,
    tighten_step_percent=10,
    mark_after_rounds=2,
    evict_after_rounds=2,
)
ROOM = Room(suppress_milli=2600, floor_milli=20, capacity_milli=4000)  # 4 CPUs: steps of 400 m
BAD = Observation(pod_stall=0.3, node_stall=None, be_active=True)
CLEAN = Observation(pod_stall=0.01, node_stall=0.02, be_active=True)
BAND = Observation(pod_stall=0.07, node_stall=None, be_active=True)


def run(
    observations: list[Observation],
    state: LadderState | None = None,
    cfg: LadderSettings = CFG,
    room: Room = ROOM,
    t0: float = 0.0,
    dt: float = 1.0,
) -> tuple[LadderState, list[tuple[Action, ...]]]:
    state = state or LadderState()
    actions = []
    for i, obs in enumerate(observations):
        out = step(state, obs, room, cfg, t0 + i * dt)
        state = out.state
        actions.append(out.actions)
    return state, actions


def test_classify_thresholds_and_band() -> None:
    assert classify(BAD, CFG) == "bad"
    assert classify(Observation(None, 0.25, False), CFG) == "bad"  # the node's own threshold
    assert classify(CLEAN, CFG) == "clean"
    assert classify(BAND, CFG) == "band"  # under 0.10 but not under 0.05
    assert classify(Observation(None, None, True), CFG) == "band"  # nothing measured: no move


def test_engages_after_n_bad_rounds_only_while_be_uses_the_resource() -> None:
    state, actions = run([BAD, BAD])
    assert state.rung is Rung.NORMAL
    assert actions == [(), ()]
    state, actions = run([BAD, BAD, BAD])
    assert state.rung is Rung.TIGHTEN
    assert actions[-1] == (Action.TIGHTEN,)
    assert state.tighten_milli == 400
    idle_be = Observation(0.3, None, be_active=False)
    state, _ = run([BAD, BAD, idle_be, BAD, BAD])
    assert state.rung is Rung.NORMAL  # the streak started over: BE was not the cause that round


def test_climbs_tighten_to_the_floor_then_marks_then_evicts() -> None:
    state, actions = run([BAD] * 3 + [BAD] * 6)
    # 400, 800, ... up to the room 2580 m (2600 − floor 20): 7 tightening rounds
    assert [a for a in actions if a] == [(Action.TIGHTEN,)] * 7
    assert state.tighten_milli == 2580
    state, actions = run([BAD] * 2, state)  # at the floor: mark after 2 more bad rounds
    assert actions == [(), (Action.MARK,)]
    assert state.rung is Rung.MARK
    state, actions = run([BAD] * 3, state)
    assert actions == [(), (Action.EVICT,), (Action.EVICT,)]  # one eviction per bad round from then on
    assert state.rung is Rung.EVICT


def test_without_room_to_tighten_it_marks_at_once() -> None:
    state, actions = run([BAD] * 3, room=Room(None, 0, 4000))  # CPU suppress not acting
    assert actions[-1] == (Action.MARK,)
    assert state.rung is Rung.MARK
    memory = LadderSettings(pod_threshold=0.1, trigger_rounds=3, tighten=False, mark_after_rounds=2)
    state, actions = run([BAD] * 3, cfg=memory)
    assert actions[-1] == (Action.MARK,)


def test_restores_after_clean_rounds_and_the_cooldown_all_at_once() -> None:
    engaged, _ = run([BAD] * 4)  # tightened twice, last climb at t=3
    assert engaged.tighten_milli == 800
    # 4 clean rounds at t=4..7: clean enough, but the cooldown (30 s since t=3) is not over
    state, actions = run([CLEAN] * 4, engaged, t0=4)
    assert state.rung is Rung.TIGHTEN
    assert all(a == () for a in actions)
    state, actions = run([CLEAN], state, t0=40)
    assert actions == [(Action.RESTORE,)]
    assert state == LadderState()


def test_a_bad_or_band_round_starts_the_clean_count_over() -> None:
    engaged, _ = run([BAD] * 3)
    state, actions = run([CLEAN, CLEAN, CLEAN, BAND, CLEAN, CLEAN, CLEAN], engaged, t0=100)
    assert state.rung is Rung.TIGHTEN
    assert all(a == () for a in actions)
    state, actions = run([CLEAN], state, t0=200)
    assert actions == [(Action.RESTORE,)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.07, max_value=0.099), min_size=1, max_size=60))
def test_no_flapping_in_the_band(stalls: list[float]) -> None:
    """A stall hovering just under the threshold (in the band) never engages from normal, and never
    restores an engaged rule, however long it lasts."""
    obs = [Observation(s, None, True) for s in stalls]
    state, actions = run(obs)
    assert state.rung is Rung.NORMAL
    assert not any(actions)
    engaged, _ = run([BAD] * 3)
    state, actions = run(obs, engaged, t0=1000)
    assert state.rung is Rung.TIGHTEN
    assert not any(Action.RESTORE in a for a in actions)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["bad", "clean", "band", "idle"]), max_size=80))
def test_invariants_over_any_sequence(kinds: list[str]) -> None:
    by = {"bad": BAD, "clean": CLEAN, "band": BAND, "idle": Observation(0.3, None, False)}
    state = LadderState()
    restores = 0
    for i, k in enumerate(kinds):
        out = step(state, by[k], ROOM, CFG, float(i))
        if Action.RESTORE in out.actions:
            restores += 1
            assert out.state == LadderState()
            assert k == "clean"
        assert 0 <= out.state.tighten_milli <= ROOM.suppress_milli - ROOM.floor_milli  # type: ignore[operator]
        assert out.state.rung >= state.rung or Action.RESTORE in out.actions  # only a restore goes down
        state = out.state
