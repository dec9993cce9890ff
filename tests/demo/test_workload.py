"""The workload processes' command lines, CPU lists and units of work (no process is started)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from koordqos.demo.runner import PHASES, _stopped, round_order
from koordqos.demo.workload import (
    BurnArgs,
    ProbeArgs,
    calibrate,
    memory_walk,
    parse_args,
    parse_cpus,
    split_cpus,
    work_unit,
)
from koordqos.model.cpuset import format_cpuset
from koordqos.testing.poll import wait_until_sync


def test_cpu_lists_parse_and_format_as_the_kernel_writes_them() -> None:
    assert parse_cpus("0") == [0]
    assert parse_cpus("1-3") == [1, 2, 3]
    assert parse_cpus("0,2-3,2") == [0, 2, 3]
    for bad in ("", "a", "3-1", "1-", "-1", "1,,2"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpus(bad)
    assert format_cpuset([3, 0, 1, 2, 7]) == "0-3,7"
    assert format_cpuset([5]) == "5"
    assert parse_cpus(format_cpuset([0, 2, 3, 4, 9])) == [0, 2, 3, 4, 9]


def test_split_gives_ls_its_own_cpus_and_the_rest_to_be() -> None:
    assert split_cpus([0, 1], 1) == ([0], [1])
    assert split_cpus([3, 1, 2, 0], 2) == ([0, 1], [2, 3])
    assert split_cpus([0, 1, 2], 5) == ([0, 1], [2])  # BE keeps at least one CPU
    assert split_cpus([0], 1) == ([0], [0])  # one CPU: no split
    assert split_cpus([0, 1], 0) == ([0, 1], [0, 1])  # asked for none


def test_probe_and_burn_arguments_round_trip_through_the_workloads_parser() -> None:
    probe = ProbeArgs("memory", 1234, 5.0, 8, (0,))
    args = parse_args(probe.argv())
    assert (args.kind, args.mode, args.iterations, args.period_ms, args.buffer_mib, args.cpus) == (
        "probe",
        "memory",
        1234,
        5.0,
        8,
        [0],
    )
    burn = parse_args(BurnArgs("stream", 64, (1, 2, 3)).argv())
    assert (burn.kind, burn.mode, burn.buffer_mib, burn.cpus) == ("burn", "stream", 64, [1, 2, 3])
    unpinned = parse_args(BurnArgs().argv())
    assert unpinned.cpus is None
    assert parse_args(["burn"]).mode == "spin"  # the old burner, as bench scripts start it


@pytest.mark.parametrize(
    "argv",
    [
        ["probe"],  # --iterations is required
        ["probe", "--iterations", "0"],
        ["probe", "--iterations", "10", "--mode", "disk"],
        ["probe", "--iterations", "10", "--period-ms", "-1"],
        ["probe", "--iterations", "10", "--cpus", "1-0"],
        ["burn", "--mode", "memory"],
        ["burn", "--buffer-mib", "0"],
        ["sleep"],
    ],
)
def test_bad_workload_arguments_exit_with_usage(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2


def test_units_of_work_are_fixed_per_slot() -> None:
    walk = memory_walk(1, 500)
    assert walk() == walk()  # the same reads every slot
    assert 0 <= walk() <= 500 * 255
    assert work_unit("cpu", 1000, 1)() == work_unit("cpu", 1000, 1)()
    with pytest.raises(ValueError, match="unknown probe mode"):
        work_unit("disk", 10, 1)
    assert calibrate(0.2, "cpu", trials=2) >= 1
    assert calibrate(0.2, "memory", buffer_mib=1, trials=2, period_ms=0.5) >= 1


def test_rounds_rotate_the_phase_order() -> None:
    names = [[p.name for p in round_order(r)] for r in range(4)]
    assert names[0] == ["ls-alone", "shares-only", "koordqos"]
    assert names[1] == ["shares-only", "koordqos", "ls-alone"]
    assert names[2] == ["koordqos", "ls-alone", "shares-only"]
    assert names[3] == names[0]
    assert all(sorted(n) == sorted(p.name for p in PHASES) for n in names)


def test_a_frozen_agent_is_recognised_before_the_quota_is_reset() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert not _stopped(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        wait_until_sync(lambda: _stopped(proc.pid), 10, 0.01, "the process stopped")
        proc.send_signal(signal.SIGCONT)
        wait_until_sync(lambda: not _stopped(proc.pid), 10, 0.01, "the process running again")
    finally:
        proc.kill()
        proc.communicate()
    assert _stopped(proc.pid)  # gone counts as stopped: nothing of it can write
