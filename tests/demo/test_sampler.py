"""Percentiles, CPU rates and per-phase figures of the demo's recorder."""

from __future__ import annotations

import pytest

from koordqos.demo.sampler import DecisionRow, Recorder, percentile, window_key


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([], 99) is None


def test_recorder_turns_counters_into_rates_and_phase_figures() -> None:
    rec = Recorder()
    assert rec.add_point(0.0, "a", 0.0, 0.0, -1) is None  # the first reading only sets the base
    rec.add_latencies(window_key("a", 0), [1000, 2000, 3000])
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
    assert rec.phase_figures("a", "A", 0.0, 1.0, rnd=1).latency_samples == 0  # another round's window
    rec.add_latencies("", [9000])  # outside any measured window: the next point's percentiles only
    assert rec.latencies.keys() == {window_key("a", 0)}
