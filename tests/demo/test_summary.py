"""The demo's figures over the rounds and the verdict's wording, from fixed per-phase figures."""

from __future__ import annotations

from typing import Any

from koordqos.demo.sampler import PhaseFigures
from koordqos.demo.summary import round_ratios, spread, summarize


def fig(
    name: str, rnd: int, p99: float, be: float = 0.0, p50: float = 1.0, quota: float = -1
) -> PhaseFigures:
    return PhaseFigures(
        name=name,
        title=name,
        start=0.0,
        end=1.0,
        latency_samples=100,
        ls_p50_ms=p50,
        ls_p99_ms=p99,
        ls_p999_ms=p99,
        ls_max_ms=p99,
        ls_cpu_cores=0.4,
        be_cpu_cores=be,
        quota_median=quota,
        quota_writes=1 if quota > 0 else 0,
        agent_cpu_cores=0.01 if name == "koordqos" else None,
        round=rnd,
    )


def rounds(
    alone: list[float], shares: list[float], koord: list[float], be: float = 0.9, koord_be: float = 0.02
) -> list[PhaseFigures]:
    out = []
    quota = koord_be * 100_000
    for r, (a, s, k) in enumerate(zip(alone, shares, koord, strict=True)):
        out += [
            fig("ls-alone", r, a),
            fig("shares-only", r, s, be),
            fig("koordqos", r, k, koord_be, quota=quota),
        ]
    return out


def summary(
    phases: list[PhaseFigures], load: float = 0.5, root_shares: int | None = 262144
) -> dict[str, Any]:
    return summarize(
        phases,
        mode="real",
        cpus=2,
        loadavg_start=(load, 0, 0),
        loadavg_end=(load, 0, 0),
        root_shares=root_shares,
    )


def test_spread_is_the_median_and_range_of_what_is_there() -> None:
    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([]) == {"median": None, "min": None, "max": None, "n": 0}


def test_ratios_are_taken_per_round_then_their_median() -> None:
    phases = rounds([2.0, 2.0, 4.0], [6.0, 4.0, 8.0], [2.2, 2.0, 4.8])
    assert round_ratios(phases, "koordqos", "ls-alone") == [1.1, 1.0, 1.2]
    s = summary(phases)
    assert s["ratios"]["koordqos_over_alone"] == {"median": 1.1, "min": 1.0, "max": 1.2, "n": 3}
    assert s["ratios"]["shares_only_over_alone"]["median"] == 2.0
    assert s["phases"]["ls-alone"]["ls_p99_ms"] == {"median": 2.0, "min": 2.0, "max": 4.0, "n": 3}
    assert s["phases"]["koordqos"]["quota_median"] == 2000
    assert s["phases"]["shares-only"]["quota_median"] is None  # unlimited
    assert s["phases"]["koordqos"]["latency_samples"] == 300


def test_goal_met_is_said_with_the_effect() -> None:
    s = summary(rounds([2.0, 2.0, 2.0], [6.0, 5.0, 7.0], [2.2, 2.1, 2.3]))
    assert s["goal"]["met"] is True
    assert s["goal"]["never_worse_than_shares_only"] is True
    assert s["goal"]["be_suppressed"] is True
    assert s["goal"]["attributable"] is True
    text = " ".join(s["verdict"])
    assert "BE (0.90 cores) slowed LS: p99 3.00× LS alone" in text
    assert "With koordqos: p99 1.10× LS alone (rounds 1.05×–1.15×)" in text
    assert s["verdict"][-1].startswith("Goal met")
    assert "loaded" not in text


def test_a_goal_met_without_suppressing_be_is_not_credited_to_koordqos() -> None:
    s = summary(rounds([2.0, 2.0, 2.0], [4.0, 4.0, 4.0], [2.2, 2.2, 2.2], koord_be=0.7))
    assert s["goal"]["met"] is True
    assert s["goal"]["be_suppressed"] is False
    assert "koordqos left BE 0.70 of its 0.90 cores" in " ".join(s["verdict"])
    assert s["verdict"][-1] == "Goal met by the numbers (≤ 1.2× LS alone), but not because of koordqos."


def test_goal_not_met_gives_the_numbers() -> None:
    s = summary(rounds([2.0, 2.0, 2.0], [6.0, 6.0, 6.0], [3.0, 3.2, 2.8]))
    assert s["goal"]["met"] is False
    assert s["verdict"][-1] == (
        "Goal not met: LS p99 with koordqos is 1.50× LS alone (goal ≤ 1.2×) and 0.50× the shares only "
        "(goal ≤ 1×)."
    )


def test_worse_than_shares_only_in_a_round_is_recorded() -> None:
    s = summary(rounds([2.0, 2.0, 2.0], [2.2, 2.2, 2.2], [2.0, 2.4, 2.0]))
    assert s["goal"]["never_worse_than_shares_only"] is False


def test_be_that_never_ran_means_nothing_to_protect_and_suggests_root_shares() -> None:
    phases = rounds([2.0, 2.0], [2.0, 2.1], [2.0, 2.0], be=0.01)
    s = summary(phases, root_shares=None)
    assert s["verdict"] == [
        "BE never ran (0.01 cores in the shares-only phase): nothing to protect; try --root-shares 262144."
    ]
    assert s["goal"]["met"] is None
    again = summary(phases, root_shares=262144)
    assert "too busy for a cpu.shares=2 pod to run" in again["verdict"][0]


def test_be_that_ran_without_slowing_ls_is_said_plainly() -> None:
    s = summary(rounds([2.0, 2.0], [2.1, 2.0], [2.0, 2.0]))
    assert any("did not slow LS" in v and "nothing to protect" in v for v in s["verdict"])
    assert s["goal"]["met"] is True
    assert s["goal"]["attributable"] is False
    assert s["verdict"][-1] == (
        "Goal met by the numbers (≤ 1.2× LS alone), but BE did not slow LS here: it shows no protection."
    )


def test_a_loaded_or_unsteady_machine_is_said_first() -> None:
    s = summary(rounds([2.0, 5.0], [6.0, 8.0], [2.0, 5.0]), load=7.5)
    assert s["verdict"][0].startswith("The machine was loaded (1-minute load average 7.50 at the start")
    assert "too unsteady to tell" in s["verdict"][1]


def test_no_complete_round_and_synthetic_runs() -> None:
    assert summary([fig("ls-alone", 0, 2.0)])["verdict"] == ["No complete round: nothing to compare."]
    synthetic = summarize(
        rounds([2.0], [3.0], [2.0]),
        mode="synthetic",
        cpus=4,
        loadavg_start=(0, 0, 0),
        loadavg_end=(0, 0, 0),
        root_shares=None,
    )
    assert synthetic["verdict"][0].startswith("Synthetic node")
    assert synthetic["goal"]["met"] is None
