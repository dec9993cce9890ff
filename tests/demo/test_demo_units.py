"""The demo's pure parts and its start-up checks: percentiles and phase figures, the exit guard, the
one-line refusal without root, the agent's command line."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from koordqos.demo import main as demo_main
from koordqos.demo.agentproc import AgentSpec
from koordqos.demo.exitguard import ExitGuard, Interrupted
from koordqos.demo.options import DemoOptions
from koordqos.demo.sampler import DecisionRow, Recorder, percentile


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([], 99) is None


def test_recorder_turns_counters_into_rates_and_phase_figures() -> None:
    rec = Recorder()
    assert rec.add_point(0.0, "a", 0.0, 0.0, -1) is None  # the first reading only sets the base
    rec.add_latencies("a", [1000, 2000, 3000])
    p = rec.add_point(1.0, "a", 1.2, 0.5, -1)
    assert p is not None
    assert (p.ls_cpu, p.be_cpu) == pytest.approx((1.2, 0.5))
    assert p.ls_p50_ms == 2.0
    assert rec.add_point(1.01, "a", 1.3, 0.5, -1) is None  # too short for a rate: merged into the next
    p2 = rec.add_point(2.0, "b", 2.2, 0.6, 20_000)
    assert p2 is not None
    assert p2.ls_cpu == pytest.approx(1.0)
    rec.add_decision(DecisionRow(1.5, "write", "kubepods/besteffort/cpu.cfs_quota_us", "-1", "20000", "x"))
    fig = rec.phase_figures("b", "B", 1.0, 2.0, agent_cpu_s=0.01)
    assert fig.quota_median == 20_000
    assert fig.quota_writes == 1
    assert fig.agent_cpu_cores == pytest.approx(0.01)
    assert fig.latency_samples == 0
    a = rec.phase_figures("a", "A", 0.0, 1.0)
    assert a.ls_p99_ms == 3.0
    assert a.agent_cpu_cores is None


def test_exit_guard_runs_each_step_once_newest_first_despite_failures() -> None:
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise OSError("busy")

    with ExitGuard() as guard:
        guard.push("first", lambda: ran.append("first"))
        guard.push("boom", boom)
        guard.push("last", lambda: ran.append("last"))
    guard.close()
    assert ran == ["last", "boom", "first"]
    assert guard.errors == ["cleanup: boom failed: busy"]


def test_exit_guard_turns_a_signal_into_an_exception_and_restores_handlers() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    ran: list[str] = []
    guard = ExitGuard()
    guard.push("step", lambda: ran.append("step"))

    def interrupted_run() -> None:
        with guard:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # not reached: the handler raises first

    with pytest.raises(Interrupted) as info:
        interrupted_run()
    assert info.value.signum == signal.SIGTERM
    assert ran == ["step"]
    assert signal.getsignal(signal.SIGTERM) == previous


def test_without_root_it_says_so_in_one_line_and_offers_synthetic(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(demo_main, "unavailable_reason", lambda: "not running as root")
    rc = demo_main.run(DemoOptions(out=tmp_path / "r", live=False))
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "not running as root" in err[0]
    assert "--synthetic" in err[0]
    assert not (tmp_path / "r").exists()


def test_agent_command_runs_local_mode_with_only_cpu_suppress(tmp_path: Path) -> None:
    spec = AgentSpec(
        cgroup_root=tmp_path / "cg",
        nri_socket=tmp_path / "nri.sock",
        nodeslo_file=tmp_path / "slo.json",
        log_file=tmp_path / "agent.log",
        interval=0.5,
        launcher=["nsexec", "--"],
    )
    cmd = spec.command()
    assert cmd[:2] == ["nsexec", "--"]
    assert cmd[cmd.index("--cgroup-root") + 1] == str(tmp_path / "cg")
    assert cmd[cmd.index("--cpu-suppress-interval-seconds") + 1] == "0.5"
    assert cmd[cmd.index("--collect-interval") + 1] == "0.5"
    gates = next(c for c in cmd if c.startswith("--feature-gates="))
    assert "BECPUSuppress=true" in gates
    assert "CPUBurst=false" in gates
    assert "--kubeconfig" not in cmd
    env = spec.env()
    assert "KUBECONFIG" not in env
    assert env["HOME"] == str(tmp_path)
    from koordqos.cli import build_parser

    args = build_parser().parse_args(cmd[cmd.index("run") :])  # the agent's own parser accepts it
    assert args.command == "run"
