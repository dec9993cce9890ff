"""The demo's result in figures and words (pure: from the per-phase, per-round figures, no I/O).

Per phase: the median over the rounds of LS p50 and p99, with the spread (min–max) over the rounds, and the
CPU BE got. Per round: the p99 ratios koordqos / LS alone, koordqos / shares only and shares only / LS
alone, then their median and spread. The verdict says in plain sentences what the figures support: BE never
ran (nothing to protect), BE ran and did not slow LS (nothing to protect either), the machine was too loaded
or LS alone too unsteady to tell, or the effect, and whether the goal was met: LS p99 with koordqos at most
`GOAL_RATIO` × LS alone and no worse than with the shares only (and whether koordqos suppressed BE at
all: if the threshold left BE most of its CPU, a difference is not koordqos's doing).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from koordqos.demo.sampler import PhaseFigures

ALONE, SHARES, KOORD = "ls-alone", "shares-only", "koordqos"
GOAL_RATIO = 1.2
#: BE got less CPU than this (cores) in the shares-only phase: it did not run, nothing was contended.
BE_RAN_CORES = 0.05
#: shares only / alone p99 at most this: BE ran but did not slow LS.
NO_EFFECT_RATIO = 1.2
#: LS alone's p99 varying more than this (max / min over the rounds): too unsteady to tell.
UNSTEADY_SPREAD = 2.0
#: a 1-minute load average above this × CPUs: the machine was loaded.
LOADED_PER_CPU = 1.0
SUGGESTED_ROOT_SHARES = 262144
#: koordqos left BE more than this share of its shares-only CPU: it did not suppress BE to speak of.
SUPPRESSED_SHARE = 0.5


def spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """{"median", "min", "max", "n"} of the values present (None where there are none)."""
    vs = [float(v) for v in values if v is not None]
    if not vs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(vs), 3), "min": min(vs), "max": max(vs), "n": len(vs)}


def _by_round(phases: Sequence[PhaseFigures]) -> dict[int, dict[str, PhaseFigures]]:
    out: dict[int, dict[str, PhaseFigures]] = {}
    for p in phases:
        out.setdefault(p.round, {})[p.name] = p
    return out


def round_ratios(phases: Sequence[PhaseFigures], top: str, bottom: str) -> list[float]:
    """p99 of `top` / p99 of `bottom`, per round that has both (in round order)."""
    out = []
    for _rnd, by in sorted(_by_round(phases).items()):
        a, b = by.get(top), by.get(bottom)
        if a and b and a.ls_p99_ms is not None and b.ls_p99_ms:
            out.append(round(a.ls_p99_ms / b.ls_p99_ms, 3))
    return out


def phase_summary(phases: Sequence[PhaseFigures], name: str) -> dict[str, Any]:
    """One phase over its rounds."""
    fs = [p for p in phases if p.name == name]
    quotas = [p.quota_median for p in fs if p.quota_median is not None and p.quota_median >= 0]
    return {
        "rounds": len(fs),
        "latency_samples": sum(p.latency_samples for p in fs),
        "ls_p50_ms": spread([p.ls_p50_ms for p in fs]),
        "ls_p99_ms": spread([p.ls_p99_ms for p in fs]),
        "be_cpu_cores": spread([round(p.be_cpu_cores, 3) for p in fs]),
        "ls_cpu_cores": spread([round(p.ls_cpu_cores, 3) for p in fs]),
        "quota_median": statistics.median(quotas) if quotas else None,  # µs per 100 ms; None: unlimited
        "quota_writes": sum(p.quota_writes for p in fs),
    }


def _x(v: float | int | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def summarize(
    phases: Sequence[PhaseFigures],
    *,
    mode: str,
    cpus: int,
    loadavg_start: Sequence[float],
    loadavg_end: Sequence[float],
    root_shares: int | None,
) -> dict[str, Any]:
    """Figures and verdict (see the module docstring)."""
    per_phase = {name: phase_summary(phases, name) for name in (ALONE, SHARES, KOORD)}
    ratios = {
        "koordqos_over_alone": round_ratios(phases, KOORD, ALONE),
        "koordqos_over_shares_only": round_ratios(phases, KOORD, SHARES),
        "shares_only_over_alone": round_ratios(phases, SHARES, ALONE),
    }
    ratio_spread = {k: spread(v) for k, v in ratios.items()}
    verdict, goal = _verdict(per_phase, ratio_spread, mode, cpus, loadavg_start, loadavg_end, root_shares)
    return {
        "phases": per_phase,
        "ratios_per_round": ratios,
        "ratios": ratio_spread,
        "goal": goal,
        "verdict": verdict,
    }


def _verdict(
    per_phase: dict[str, dict[str, Any]],
    ratios: dict[str, dict[str, Any]],
    mode: str,
    cpus: int,
    loadavg_start: Sequence[float],
    loadavg_end: Sequence[float],
    root_shares: int | None,
) -> tuple[list[str], dict[str, Any]]:
    goal: dict[str, Any] = {"target_ratio": GOAL_RATIO, "met": None, "never_worse_than_shares_only": None}
    out: list[str] = []
    load = max(loadavg_start[0], loadavg_end[0]) if loadavg_start and loadavg_end else 0.0
    if load > cpus * LOADED_PER_CPU:
        out.append(
            f"The machine was loaded (1-minute load average {loadavg_start[0]:.2f} at the start, "
            f"{loadavg_end[0]:.2f} at the end, on {cpus} CPUs): other work ran in every phase."
        )
    if mode != "real":
        out.append(
            "Synthetic node: no latency is measured; the figures are the agent's decisions and BE CPU."
        )
        return out, goal
    ko, sh, al = (
        ratios["koordqos_over_alone"],
        ratios["koordqos_over_shares_only"],
        ratios["shares_only_over_alone"],
    )
    if not ko["n"] or not sh["n"]:
        out.append("No complete round: nothing to compare.")
        return out, goal
    be = per_phase[SHARES]["be_cpu_cores"]["median"] or 0.0
    if be < BE_RAN_CORES:
        hint = (
            f"try --root-shares {SUGGESTED_ROOT_SHARES}"
            if root_shares is None
            else "the machine is too busy for a cpu.shares=2 pod to run"
        )
        out.append(f"BE never ran ({be:.2f} cores in the shares-only phase): nothing to protect; {hint}.")
        return out, goal
    alone = per_phase[ALONE]["ls_p99_ms"]
    if alone["min"] and alone["max"] / alone["min"] > UNSTEADY_SPREAD:
        out.append(
            f"LS alone's p99 varied {alone['min']:.2f}–{alone['max']:.2f} ms over the rounds: the machine "
            "was too unsteady to tell an effect of BE from noise."
        )
    if al["median"] is not None and al["median"] <= NO_EFFECT_RATIO:
        out.append(
            f"BE ran ({be:.2f} cores) but did not slow LS (p99 {_x(al['median'])} LS alone with the shares "
            "only): nothing to protect."
        )
    else:
        out.append(
            f"BE ({be:.2f} cores) slowed LS: p99 {_x(al['median'])} LS alone with kubelet's shares only "
            f"(rounds {_x(al['min'])}–{_x(al['max'])})."
        )
    kq = per_phase[KOORD]
    kq_be = kq["be_cpu_cores"]["median"] or 0.0
    quota = "unlimited" if kq["quota_median"] is None else f"{kq['quota_median'] / 1e5:.2f} cores"
    out.append(
        f"With koordqos: p99 {_x(ko['median'])} LS alone (rounds {_x(ko['min'])}–{_x(ko['max'])}), "
        f"{_x(sh['median'])} the shares only (rounds {_x(sh['min'])}–{_x(sh['max'])}); BE got {kq_be:.2f} "
        f"cores under a quota of {quota} (median)."
    )
    goal["met"] = ko["median"] <= GOAL_RATIO and sh["median"] <= 1.0
    goal["never_worse_than_shares_only"] = sh["max"] <= 1.0
    goal["be_suppressed"] = kq_be <= be * SUPPRESSED_SHARE
    if not goal["be_suppressed"]:
        out.append(
            f"koordqos left BE {kq_be:.2f} of its {be:.2f} cores (the threshold left that much room): a "
            "difference in LS latency between these phases is not koordqos's doing."
        )
    no_effect = al["median"] is not None and al["median"] <= NO_EFFECT_RATIO
    goal["attributable"] = goal["be_suppressed"] and not no_effect
    if goal["met"] and not goal["be_suppressed"]:
        out.append(f"Goal met by the numbers (≤ {GOAL_RATIO:g}× LS alone), but not because of koordqos.")
    elif goal["met"] and no_effect:
        out.append(
            f"Goal met by the numbers (≤ {GOAL_RATIO:g}× LS alone), but BE did not slow LS here: it shows "
            "no protection."
        )
    elif goal["met"]:
        out.append(
            f"Goal met: LS p99 with koordqos ≤ {GOAL_RATIO:g}× LS alone and no worse than shares only."
        )
    else:
        out.append(
            f"Goal not met: LS p99 with koordqos is {_x(ko['median'])} LS alone (goal ≤ {GOAL_RATIO:g}×) and "
            f"{_x(sh['median'])} the shares only (goal ≤ 1×)."
        )
    return out, goal
