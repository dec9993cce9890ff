"""The demo's report: a JSON file of every figure and a PNG chart (latency over time, phases, quota)."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from koordqos import __version__
from koordqos.demo.runner import PHASES, STARTING, RunResult
from koordqos.demo.sampler import PhaseFigures

JSON_NAME = "koordqos-demo.json"
PNG_NAME = "koordqos-demo.png"
PHASE_COLOURS = {"ls-alone": "#e8f4ea", "be-no-agent": "#fbe9e7", STARTING: "#eeeeee", "be-agent": "#e3f2fd"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def _by_name(result: RunResult) -> dict[str, PhaseFigures]:
    return {p.name: p for p in result.phases}


def report_dict(result: RunResult, files: dict[str, str]) -> dict[str, Any]:
    """Every figure of the run as JSON-ready data."""
    phases = _by_name(result)
    noagent, agent = phases.get("be-no-agent"), phases.get("be-agent")
    p99 = {name: f.ls_p99_ms for name, f in phases.items()}
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
        },
        "options": options,
        "probe_iterations": result.iterations,
        "phases": [p.as_dict() for p in result.phases],
        "ratios": {
            "ls_p99_no_agent_over_alone": _ratio(p99.get("be-no-agent"), p99.get("ls-alone")),
            "ls_p99_agent_over_alone": _ratio(p99.get("be-agent"), p99.get("ls-alone")),
            "ls_p99_agent_over_no_agent": _ratio(p99.get("be-agent"), p99.get("be-no-agent")),
            "be_cpu_agent_over_no_agent": _ratio(
                agent.be_cpu_cores if agent else None, noagent.be_cpu_cores if noagent else None
            ),
        },
        "agent": {
            "startup_seconds": result.agent_startup_seconds,
            "exit_code": result.agent_exit_code,
            "decisions": len(result.recorder.decisions),
            "quota_writes": sum(1 for d in result.recorder.decisions if d.action == "write"),
            "cpu_cores": agent.agent_cpu_cores if agent else None,
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
    fig, (ax_lat, ax_cpu) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=(3, 2))
    # phase backgrounds, from the points' phase labels
    spans: list[tuple[str, float, float]] = []
    for p in pts:
        if spans and spans[-1][0] == p.phase:
            spans[-1] = (p.phase, spans[-1][1], p.t)
        else:
            spans.append((p.phase, spans[-1][2] if spans else p.t, p.t))
    titles = {ph.name: ph.title for ph in PHASES} | {STARTING: "agent starting"}
    for name, a, b in spans:
        for ax in (ax_lat, ax_cpu):
            ax.axvspan(a, b, color=PHASE_COLOURS.get(name, "#ffffff"), zorder=0)
        ax_lat.text(
            (a + b) / 2,
            1.01,
            titles.get(name, name),
            transform=ax_lat.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    if result.mode == "real":
        ax_lat.plot(t, [p.ls_p99_ms for p in pts], color="#c62828", lw=1.2, label="LS p99")
        ax_lat.plot(t, [p.ls_p50_ms for p in pts], color="#2e7d32", lw=1.0, label="LS p50")
        ax_lat.set_yscale("log")
        ax_lat.set_ylabel(f"probe latency, ms (per {result.options.sample_interval:g} s)")
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
    ax_cpu.plot(t, [p.be_cpu for p in pts], color="#ef6c00", lw=1.2, label="BE CPU (cores)")
    ax_cpu.plot(t, [p.ls_cpu for p in pts], color="#1565c0", lw=1.0, label="LS CPU (cores)")
    quota = [p.quota / 100_000 if p.quota >= 0 else float("nan") for p in pts]
    ax_cpu.step(
        t, quota, where="post", color="#000000", lw=1.4, ls="--", label="BE quota (cores; gap = unlimited)"
    )
    ax_cpu.set_ylabel("cores")
    ax_cpu.set_xlabel("seconds")
    ax_cpu.set_ylim(bottom=0)
    ax_cpu.legend(loc="upper left", fontsize=8)
    load = " ".join(f"{v:.2f}" for v in result.loadavg_start)
    fig.suptitle(
        f"koordqos demo ({result.mode}, cgroup {result.cgroup_version}, {result.cpus} CPUs, "
        f"agent interval {result.options.interval:g} s, load average {load})",
        fontsize=10,
    )
    fig.tight_layout()
    path = out / PNG_NAME
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
