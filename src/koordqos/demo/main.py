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

from koordqos.demo.cgtree import unavailable_reason
from koordqos.demo.exitguard import ExitGuard, Interrupted
from koordqos.demo.live import make_view
from koordqos.demo.options import DemoOptions
from koordqos.demo.realnode import RealNode
from koordqos.demo.report import write_chart, write_json
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


def _summary(result: RunResult, files: dict[str, str]) -> None:
    print()
    print(f"{'phase':<20} {'LS p50':>9} {'LS p99':>9} {'LS CPU':>7} {'BE CPU':>7} {'quota (median)':>15}")
    for p in result.phases:
        p50 = "—" if p.ls_p50_ms is None else f"{p.ls_p50_ms:.2f} ms"
        p99 = "—" if p.ls_p99_ms is None else f"{p.ls_p99_ms:.2f} ms"
        q = "unlimited" if p.quota_median is None or p.quota_median < 0 else f"{p.quota_median:.0f} µs"
        print(f"{p.title:<20} {p50:>9} {p99:>9} {p.ls_cpu_cores:>7.2f} {p.be_cpu_cores:>7.2f} {q:>15}")
    load = " ".join(f"{v:.2f}" for v in result.loadavg_start)
    print(f"load average at start: {load}; decisions: {len(result.recorder.decisions)}")
    if result.scratch_removed is not None:
        print(
            f"scratch cgroups {result.scratch_name}: {'removed' if result.scratch_removed else 'LEFT BEHIND'}"
        )
    for kind, path in files.items():
        print(f"{kind}: {path}")
