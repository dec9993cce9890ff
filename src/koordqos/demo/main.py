"""`python -m koordqos demo`: checks, the backend, the run, the report; returns the exit code.

Exit codes: 0 done; 1 the run failed (the agent did not start, …); 2 cannot run here (no root or writable
cgroup hierarchy without `--synthetic`, or the `demo` extra is missing); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from koordqos.demo.cgtree import unavailable_reason
from koordqos.demo.exitguard import ExitGuard, Interrupted
from koordqos.demo.live import make_view
from koordqos.demo.options import DemoOptions
from koordqos.demo.realnode import RealNode
from koordqos.demo.report import run_summary, write_chart, write_json
from koordqos.demo.runner import Backend, Runner, RunResult
from koordqos.demo.synthetic import SyntheticBackend


def missing_extras(live: bool) -> list[str]:
    """The `demo` extra's packages this run needs and cannot import."""
    wanted = ["matplotlib"] + (["rich"] if live and sys.stdout.isatty() else [])
    return [m for m in wanted if importlib.util.find_spec(m) is None]


def run(opts: DemoOptions) -> int:
    """Run the demo (see the module docstring)."""
    missing = missing_extras(opts.live)
    if missing:
        print(f"koordqos demo: needs {', '.join(missing)}: pip install 'koordqos[demo]'", file=sys.stderr)
        return 2
    if not opts.synthetic:
        reason = unavailable_reason()
        if reason:
            print(
                f"koordqos demo: cannot use the real kernel here ({reason}); "
                "run `python -m koordqos demo --synthetic` for the same flow on a synthetic node",
                file=sys.stderr,
            )
            return 2
    # a short path: the NRI unix socket lives here
    workdir = Path(tempfile.mkdtemp(prefix="kqdemo-", dir="/tmp"))
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    rc = 0
    with ExitGuard() as guard:
        guard.push(f"remove {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
        backend: Backend
        if opts.synthetic:
            backend = SyntheticBackend(workdir, opts.synthetic_cpus, opts.work_ms, opts.period_ms)
            scratch = ""
        else:
            real = RealNode(workdir, guard, opts.root_shares)
            backend, scratch = real, real.tree.name
        result = RunResult(opts, backend.kind, backend.cgroup_version, backend.cpus, 0, scratch_name=scratch)
        view = make_view(opts.live)
        guard.push("close the view", view.close)
        guard.push("keep the agent log", lambda: _keep_log(workdir / "agent.log", out / "agent.log"))
        try:
            asyncio.run(guard.interruptible(Runner(opts, backend, view, workdir).run(result)))
        except Interrupted as exc:
            result.error = f"interrupted ({exc})"
            rc = 130
        except (RuntimeError, OSError) as exc:
            result.error = str(exc)
            rc = 1
    result.scratch_removed = not backend.scratch_left() if backend.kind == "real" else None
    files = {"json": str(out / "koordqos-demo.json"), "png": str(out / "koordqos-demo.png")}
    if result.recorder.points:
        write_chart(result, out)
    else:
        files.pop("png")
    write_json(result, out, files)
    _summary(result, files)
    if result.error:
        print(f"koordqos demo: {result.error}", file=sys.stderr)
    return rc


def _keep_log(src: Path, dst: Path) -> None:
    if src.exists():
        shutil.copyfile(src, dst)


def _range(s: dict[str, Any], unit: str = "") -> str:
    if s["median"] is None:
        return "—"
    return f"{s['median']:.2f}{unit} ({s['min']:.2f}–{s['max']:.2f})"


def _summary(result: RunResult, files: dict[str, str]) -> None:
    summary = run_summary(result)
    rounds = result.options.rounds
    print()
    print(f"median over {rounds} rounds (min–max over the rounds)")
    print(
        f"{'phase':<30} {'LS p50 ms':>20} {'LS p99 ms':>20} {'LS CPU cores':>18} {'BE CPU cores':>18} "
        f"{'BE quota':>12}"
    )
    for name, title in (
        ("ls-alone", "LS alone"),
        ("shares-only", "LS + BE, shares only"),
        ("koordqos", "LS + BE, koordqos"),
    ):
        ph = summary["phases"][name]
        q = "unlimited" if ph["quota_median"] is None else f"{ph['quota_median'] / 1e5:.2f} cores"
        print(
            f"{title:<30} {_range(ph['ls_p50_ms']):>20} {_range(ph['ls_p99_ms']):>20} "
            f"{_range(ph['ls_cpu_cores']):>18} {_range(ph['be_cpu_cores']):>18} {q:>12}"
        )
    for key, label in (
        ("shares_only_over_alone", "p99 shares only / alone"),
        ("koordqos_over_alone", "p99 koordqos / alone"),
        ("koordqos_over_shares_only", "p99 koordqos / shares only"),
    ):
        per = summary["ratios_per_round"][key]
        print(f"{label:<30} {_range(summary['ratios'][key], '×'):>20}  per round {per}")
    start, end = (" ".join(f"{v:.2f}" for v in la) for la in (result.loadavg_start, result.loadavg_end))
    print(f"load average at start: {start}; at end: {end}; decisions: {len(result.recorder.decisions)}")
    for sentence in summary["verdict"]:
        print(sentence)
    if result.scratch_removed is not None:
        print(
            f"scratch cgroups {result.scratch_name}: {'removed' if result.scratch_removed else 'LEFT BEHIND'}"
        )
    for kind, path in files.items():
        print(f"{kind}: {path}")
