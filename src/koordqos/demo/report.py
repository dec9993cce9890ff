"""The demo's report: a JSON file of every figure and a PNG chart (latency and CPU over time, with the
phases; the p99 of every phase and round)."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from koordqos import __version__
from koordqos.demo.runner import PHASES, SETTLE, STARTING, WARMUP, RunResult
from koordqos.demo.summary import summarize

JSON_NAME = "koordqos-demo.json"
PNG_NAME = "koordqos-demo.png"
PHASE_COLOURS = {
    "ls-alone": "#e8f4ea",
    "shares-only": "#fbe9e7",
    "koordqos": "#e3f2fd",
    STARTING: "#dddddd",
    WARMUP: "#eeeeee",
    SETTLE: "#f7f7f7",
}
DOT_COLOURS = {"ls-alone": "#2e7d32", "shares-only": "#c62828", "koordqos": "#1565c0"}


def run_summary(result: RunResult) -> dict[str, Any]:
    """The figures over the rounds and the verdict (`summary.summarize`)."""
    return summarize(
        result.phases,
        mode=result.mode,
        cpus=result.cpus,
        loadavg_start=result.loadavg_start,
        loadavg_end=result.loadavg_end,
        root_shares=result.options.root_shares,
    )


def report_dict(result: RunResult, files: dict[str, str]) -> dict[str, Any]:
    """Every figure of the run as JSON-ready data."""
    summary = run_summary(result)
    koord = [p for p in result.phases if p.name == "koordqos"]
    agent_cpu = [p.agent_cpu_cores for p in koord if p.agent_cpu_cores is not None]
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result.options).items()}
    return {
        "koordqos_version": __version__,
        "mode": result.mode,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result.started_wall)),
        "machine": {
            "cpus": result.cpus,
            "kernel": platform.release(),
            "python": platform.python_version(),
            "cgroup_version": result.cgroup_version,
            "loadavg_start": list(result.loadavg_start),
            "loadavg_end": list(result.loadavg_end),
            "ls_cpus": result.ls_cpus,
            "be_cpus": result.be_cpus,
        },
        "options": options,
        "probe_iterations": result.iterations,
        "summary": summary,
        "phases": [p.as_dict() for p in result.phases],
        "agent": {
            "startup_seconds": result.agent_startup_seconds,
            "exit_code": result.agent_exit_code,
            "decisions": len(result.recorder.decisions),
            "quota_writes": sum(1 for d in result.recorder.decisions if d.action == "write"),
            "cpu_cores": max(agent_cpu) if agent_cpu else None,  # the most of any koordqos phase
        },
        "scratch": {"name": result.scratch_name, "removed": result.scratch_removed},
        "error": result.error,
        "points": [asdict(p) for p in result.recorder.points],
        "decisions": [asdict(d) for d in result.recorder.decisions],
        "files": files,
    }


def write_json(result: RunResult, out: Path, files: dict[str, str]) -> Path:
    """Write the JSON report; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / JSON_NAME
    path.write_text(json.dumps(report_dict(result, files), indent=1) + "\n")
    return path


def write_chart(result: RunResult, out: Path) -> Path:
    """Write the PNG chart; returns its path (needs matplotlib: the `demo` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    pts = result.recorder.points
    t = [p.t for p in pts]
    fig = plt.figure(figsize=(12, 9))
    grid = fig.add_gridspec(3, 1, height_ratios=(3, 2, 2.4))
    ax_lat = fig.add_subplot(grid[0])
    ax_cpu = fig.add_subplot(grid[1], sharex=ax_lat)
    ax_rounds = fig.add_subplot(grid[2])
    # phase backgrounds, from the points' phase labels
    spans: list[tuple[str, float, float]] = []
    for p in pts:
        if spans and spans[-1][0] == p.phase:
            spans[-1] = (p.phase, spans[-1][1], p.t)
        else:
            spans.append((p.phase, spans[-1][2] if spans else p.t, p.t))
    short = {"ls-alone": "alone", "shares-only": "shares", "koordqos": "koordqos", STARTING: "start"}
    for name, a, b in spans:
        for ax in (ax_lat, ax_cpu):
            ax.axvspan(a, b, color=PHASE_COLOURS.get(name, "#ffffff"), zorder=0)
        if name in short or name == WARMUP:
            ax_lat.text(
                (a + b) / 2,
                1.01,
                short.get(name, "warm-up"),
                transform=ax_lat.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    if result.mode == "real":
        ax_lat.plot(t, [_nan(p.ls_p99_ms) for p in pts], color="#c62828", lw=1.0, label="LS p99")
        ax_lat.plot(t, [_nan(p.ls_p50_ms) for p in pts], color="#2e7d32", lw=0.9, label="LS p50")
        ax_lat.set_yscale("log")
        ax_lat.set_ylabel(f"probe latency, ms\n(per {result.options.sample_interval:g} s)")
        ax_lat.legend(loc="upper left", fontsize=8)
    else:
        ax_lat.text(
            0.5,
            0.5,
            "synthetic node: simulated usage, no latency measured",
            ha="center",
            va="center",
            transform=ax_lat.transAxes,
            color="#555555",
        )
        ax_lat.set_yticks([])
    ax_cpu.plot(t, [p.be_cpu for p in pts], color="#ef6c00", lw=1.1, label="BE CPU (cores)")
    ax_cpu.plot(t, [p.ls_cpu for p in pts], color="#1565c0", lw=0.9, label="LS CPU (cores)")
    quota = [p.quota / 100_000 if p.quota >= 0 else float("nan") for p in pts]
    ax_cpu.step(
        t, quota, where="post", color="#000000", lw=1.2, ls="--", label="BE quota (cores; gap = unlimited)"
    )
    ax_cpu.set_ylabel("cores")
    ax_cpu.set_xlabel("seconds (grey: agent start, warm-up and settling, not measured)")
    ax_cpu.set_ylim(bottom=0)
    ax_cpu.legend(loc="upper left", fontsize=8)
    _rounds_panel(ax_rounds, result)
    load = " / ".join(f"{a[0]:.2f}" for a in (result.loadavg_start, result.loadavg_end))
    fig.suptitle(
        f"koordqos demo ({result.mode}, cgroup {result.cgroup_version}, {result.cpus} CPUs, LS on CPUs "
        f"{_cpus(result.ls_cpus)}, BE on {_cpus(result.be_cpus)}; {result.options.probe_mode} probe, "
        f"{result.options.be_mode} BE; load average {load} at start / end)",
        fontsize=9,
    )
    fig.tight_layout()
    path = out / PNG_NAME
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _nan(v: float | None) -> float:
    return float("nan") if v is None else v


def _cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus) or "—"


def _rounds_panel(ax: Any, result: RunResult) -> None:
    """LS p99 of every phase and round (dots) and the median over the rounds (bars)."""
    summary = run_summary(result)
    names = [ph.name for ph in PHASES]
    for i, ph in enumerate(PHASES):
        vals = [p.ls_p99_ms for p in result.phases if p.name == ph.name and p.ls_p99_ms is not None]
        med = summary["phases"][ph.name]["ls_p99_ms"]["median"]
        if med is not None:
            ax.bar(i, med, width=0.5, color=PHASE_COLOURS[ph.name], edgecolor=DOT_COLOURS[ph.name])
            ax.text(i + 0.28, med, f"{med:.2f} ms", va="center", fontsize=8)
        ax.scatter([i] * len(vals), vals, color=DOT_COLOURS[ph.name], zorder=3, s=18)
    ax.set_xticks(range(len(names)), [ph.title for ph in PHASES], fontsize=8)
    ax.set_ylabel("LS p99, ms\n(dots: rounds; bar: median)")
    ax.set_ylim(bottom=0)
    verdict = summary["verdict"]
    if result.mode == "real" and verdict:
        ax.set_title(verdict[-1], fontsize=8)
