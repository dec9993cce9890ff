"""The live terminal view renders the phase, the figures and the decisions (rich, to a string)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from koordqos.demo.live import LiveView, PlainView
from koordqos.demo.runner import PHASES
from koordqos.demo.sampler import DecisionRow, Point

POINT = Point(12.5, "koordqos", 1.21, 0.02, 2000, 1.25, 4.5)
DECISION = DecisionRow(
    11.0, "write", "kubepods/besteffort/cpu.cfs_quota_us", "-1", "2000", "AdjustBEByNodeCPUUsage"
)


def test_live_view_shows_phase_figures_and_decisions() -> None:
    out = io.StringIO()
    view = LiveView(Console(file=out, width=140, force_terminal=True, color_system=None))
    view.phase(PHASES[2], 2, 3, 20.0)
    view.point(POINT, 0.5, 1.98)
    view.decision(DECISION)
    view.note("agent ready after 2.1 s")
    view.close()
    text = out.getvalue()
    assert "phase 3/3" in text
    assert "LS + BE, koordqos" in text
    assert "1.25 ms" in text
    assert "4.50 ms" in text
    assert "2000 µs (0.02 cores)" in text
    assert "1.98 cores" in text
    assert "besteffort/cpu.cfs_quota_us" in text
    assert "-1 → 2000" in text
    assert "CPU suppress decisions (1)" in text
    assert "agent ready after 2.1 s" in text


def test_plain_view_prints_a_line_per_decision(capsys: pytest.CaptureFixture[str]) -> None:
    view = PlainView()
    view.phase(PHASES[0], 0, 3, 20.0)
    view.point(POINT, 1.0, None)
    view.decision(DECISION)
    out = capsys.readouterr().out
    assert "== phase 1/3: LS alone (20 s)" in out
    assert "LS p50 1.25 ms p99 4.50 ms" in out
    assert "decision t=11.0s write kubepods/besteffort/cpu.cfs_quota_us: -1 → 2000" in out
