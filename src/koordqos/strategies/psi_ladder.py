"""The PSI interference ladder (pure): one rule's state, one round's observation in, its next state and the
actions to take out. No I/O, no clock: the caller passes `now`.

A rule watches one resource (cpu or memory). A round is **bad** when a latency-sensitive pod's (or the
node's) stall fraction is over its threshold, **clean** when every stall is under the threshold × the clear
ratio, and neither in between (the hysteresis band: no rung moves, and clean streaks start over). The rule
**engages** after `trigger_rounds` consecutive bad rounds while BE pods use the resource (BE usage is asked
only to engage: once BE is held back its usage falls, and that must not read as "nothing to do").

Once engaged, every further bad round climbs: `TIGHTEN` lowers the BE CPU suppress target by one step per
bad round until the suppress floor (cpu rules with CPU suppress acting; memory rules skip it), then after
`mark_after_rounds` bad rounds at the floor `MARK` sets a node condition and a `PreferNoSchedule` taint,
then after `evict_after_rounds` more `EVICT` evicts one BE pod per bad round. `clear_rounds` consecutive
clean rounds, and at least `cooldown_seconds` since the last climb, **restore** everything at once: the
tightening lifted, the condition cleared and the taint removed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Rung(enum.IntEnum):
    """Where a rule stands; higher is stronger."""

    NORMAL = 0
    TIGHTEN = 1
    MARK = 2
    EVICT = 3


@dataclass(frozen=True, slots=True)
class LadderSettings:
    """One rule's thresholds and pace (the agent config's `psi.cpu` / `psi.memory`)."""

    pod_threshold: float = 0.10
    node_threshold: float = 0.20
    clear_ratio: float = 0.5
    trigger_rounds: int = 3
    clear_rounds: int = 10
    cooldown_seconds: float = 300.0
    tighten_step_percent: float = 10.0
    mark_after_rounds: int = 3
    evict_after_rounds: int = 5
    tighten: bool = True  # False: the rule has no tightening rung (memory)


@dataclass(frozen=True, slots=True)
class Observation:
    """One round: the worst latency-sensitive pod's stall, the node's (None: not measured), BE's use."""

    pod_stall: float | None
    node_stall: float | None
    be_active: bool


@dataclass(frozen=True, slots=True)
class Room:
    """How much tightening CPU suppress can take: the untightened suppress target and its floor, in
    milli-cores (None: CPU suppress is not acting, nothing to tighten)."""

    suppress_milli: int | None
    floor_milli: int
    capacity_milli: int


@dataclass(frozen=True, slots=True)
class LadderState:
    """A rule's standing between rounds."""

    rung: Rung = Rung.NORMAL
    bad_streak: int = 0  # consecutive bad rounds (before engaging)
    clean_streak: int = 0  # consecutive clean rounds (engaged)
    rung_rounds: int = 0  # bad rounds since the rung was reached (or since the floor, when tightening)
    tighten_milli: int = 0
    climbed_at: float | None = None  # when it last climbed (the cooldown counts from there)


class Action(enum.StrEnum):
    """What a round asks the caller to do."""

    TIGHTEN = "tighten"  # set the suppress tightening to state.tighten_milli
    MARK = "mark"  # node condition + PreferNoSchedule taint
    EVICT = "evict"  # one BE pod
    RESTORE = "restore"  # tightening 0, condition cleared, taint removed


@dataclass(frozen=True, slots=True)
class Step:
    """A round's outcome: the next state, the actions, and why (for the decision log)."""

    state: LadderState
    actions: tuple[Action, ...] = ()
    why: str = ""


def classify(obs: Observation, cfg: LadderSettings) -> str:
    """ "bad", "clean" or "band" (in between, or nothing measured)."""
    values = [(v, t) for v, t in ((obs.pod_stall, cfg.pod_threshold), (obs.node_stall, cfg.node_threshold))]
    measured = [(v, t) for v, t in values if v is not None]
    if not measured:
        return "band"
    if any(v > t for v, t in measured):
        return "bad"
    if all(v < t * cfg.clear_ratio for v, t in measured):
        return "clean"
    return "band"


def _describe(obs: Observation) -> str:
    parts = []
    if obs.pod_stall is not None:
        parts.append(f"pod stall {obs.pod_stall:.2f}")
    if obs.node_stall is not None:
        parts.append(f"node stall {obs.node_stall:.2f}")
    return ", ".join(parts) or "no stall measured"


def step(state: LadderState, obs: Observation, room: Room, cfg: LadderSettings, now: float) -> Step:
    """One round of the ladder (see the module docstring)."""
    kind = classify(obs, cfg)
    seen = _describe(obs)
    if state.rung is Rung.NORMAL:
        if kind != "bad" or not obs.be_active:
            return Step(replace(state, bad_streak=0))
        streak = state.bad_streak + 1
        if streak < cfg.trigger_rounds:
            return Step(replace(state, bad_streak=streak))
        why = f"{seen} over the threshold for {streak} rounds while BE pods use the resource"
        engaged = LadderState(Rung.TIGHTEN, climbed_at=now)
        return _climb(engaged, room, cfg, now, why, first=True)
    if kind == "clean":
        clean = state.clean_streak + 1
        cooled = state.climbed_at is None or now - state.climbed_at >= cfg.cooldown_seconds
        if clean >= cfg.clear_rounds and cooled:
            why = f"{seen}: clean for {clean} rounds and {cfg.cooldown_seconds:.0f} s since the last step"
            return Step(LadderState(), (Action.RESTORE,), why)
        return Step(replace(state, clean_streak=clean))
    if kind == "band":
        return Step(replace(state, clean_streak=0))
    return _climb(replace(state, clean_streak=0), room, cfg, now, f"{seen} still over the threshold")


def _climb(
    state: LadderState, room: Room, cfg: LadderSettings, now: float, why: str, first: bool = False
) -> Step:
    """An engaged rule's bad round: tighten further, or count towards the next rung and take it."""
    if state.rung is Rung.TIGHTEN:
        step_milli = max(1, int(room.capacity_milli * cfg.tighten_step_percent / 100))
        room_milli = None if room.suppress_milli is None else room.suppress_milli - room.floor_milli
        if cfg.tighten and room_milli is not None and state.tighten_milli < room_milli:
            tighten = min(room_milli, state.tighten_milli + step_milli)
            new = replace(state, tighten_milli=tighten, rung_rounds=0, climbed_at=now)
            return Step(new, (Action.TIGHTEN,), f"{why}: BE suppress tightened by {tighten} m")
        rounds = 0 if first else state.rung_rounds + 1
        if rounds < cfg.mark_after_rounds and cfg.tighten and room_milli is not None:
            return Step(replace(state, rung_rounds=rounds), (), f"{why}: BE suppress at its floor")
        marked = replace(state, rung=Rung.MARK, rung_rounds=0, climbed_at=now)
        return Step(marked, (Action.MARK,), f"{why}: node marked (condition and PreferNoSchedule taint)")
    if state.rung is Rung.MARK:
        rounds = state.rung_rounds + 1
        if rounds < cfg.evict_after_rounds:
            return Step(replace(state, rung_rounds=rounds), (), f"{why}: node marked")
        evicting = replace(state, rung=Rung.EVICT, rung_rounds=0, climbed_at=now)
        return Step(evicting, (Action.EVICT,), f"{why}: evicting a BE pod")
    return Step(replace(state, climbed_at=now), (Action.EVICT,), f"{why}: evicting a BE pod")
