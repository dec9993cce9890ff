"""`python -m koordqos demo` end to end as a subprocess: --synthetic everywhere, the real kernel where the
machine allows (root and a writable cgroup hierarchy); the report's fields and the cleanup afterwards."""

from __future__ import annotations

import fcntl
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from koordqos.demo import main as demo_main
from koordqos.demo.cgtree import NAME_PREFIX, REAL_ROOT, owner_alive, sweep_stale, unavailable_reason
from koordqos.demo.options import DemoOptions
from koordqos.testing.poll import wait_until_sync
from koordqos.testing.scratchcg import REAL_SUBSYSTEMS

pytestmark = pytest.mark.e2e
PHASE_NAMES = ["ls-alone", "shares-only", "koordqos"]  # round 1's order
SHORT = ["--rounds", "1", "--settle-seconds", "1", "--warmup-seconds", "1"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REAL_DEMO_LOCK = Path("/tmp/koordqos-real-demo-tests.lock")


def demo(out: Path, *flags: str, timeout: float = 240) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "koordqos", "demo", "--no-live", "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def load_report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "koordqos-demo.json").read_text())
    return report


def scratch_dirs() -> set[str]:
    """koordqos-demo-* dirs in any controller of the real hierarchy."""
    found: set[str] = set()
    for sub in REAL_SUBSYSTEMS:
        base = REAL_ROOT / sub
        if base.is_dir():
            found |= {p.name for p in base.iterdir() if p.name.startswith("koordqos-demo-")}
    return found


def left_behind(before: set[str]) -> set[str]:
    """Scratch trees made since `before` whose demo has exited (the test's demos have, when it asks). A
    tree whose demo still runs is another process's (bench/colocation.py, a second pytest): not counted."""
    return {name for name in scratch_dirs() - before if not owner_alive(name)}


def owned_by(pid: int) -> set[str]:
    """The scratch trees of the demo process `pid` (their names record the owner)."""
    return {name for name in scratch_dirs() if name.startswith(f"{NAME_PREFIX}{pid}-")}


def check_common(report: dict[str, Any], out: Path) -> dict[str, dict[str, Any]]:
    assert [p["name"] for p in report["phases"]] == PHASE_NAMES
    phases = {p["name"]: p for p in report["phases"]}
    assert report["machine"]["cpus"] >= 1
    assert len(report["machine"]["loadavg_start"]) == 3
    assert report["agent"]["startup_seconds"] > 0
    assert report["agent"]["exit_code"] == 0  # stopped cleanly by SIGTERM
    writes = [d for d in report["decisions"] if d["action"] == "write" and "cfs_quota_us" in d["target"]]
    assert writes, "the agent made no quota decision"
    assert writes[0]["old"] == "-1"
    # the agent started, warmed up and was frozen before anything was measured
    starts = [p["t"] for p in report["points"] if p["phase"] in ("agent-starting", "agent-warm-up")]
    assert starts
    assert max(starts) < phases["ls-alone"]["start"]
    # resumed for its phase, it set the quota again (in the unmeasured settling before it)
    assert any(d["t"] > phases["shares-only"]["end"] for d in writes)
    assert phases["koordqos"]["quota_median"] >= 2000
    assert phases["ls-alone"]["quota_median"] == -1  # put back to unlimited outside the koordqos phase
    assert phases["shares-only"]["quota_median"] == -1
    assert phases["koordqos"]["agent_cpu_cores"] is not None
    assert phases["shares-only"]["agent_cpu_cores"] is None
    assert phases["ls-alone"]["be_cpu_cores"] < 0.05
    assert {p["phase"] for p in report["points"]} >= set(PHASE_NAMES) | {"settle", "agent-warm-up"}
    assert (out / "koordqos-demo.png").read_bytes()[:8] == PNG_MAGIC
    assert report["files"]["png"] == str(out / "koordqos-demo.png")
    assert report["summary"]["verdict"]
    return phases


def test_synthetic_demo_reports_the_agents_decisions(tmp_path: Path) -> None:
    out = tmp_path / "report"
    flags = ["--synthetic", "--phase-seconds", "5", "--interval", "0.5", "--threshold", "40", *SHORT]
    rc, stdout, stderr = demo(out, *flags)
    assert rc == 0, stderr
    report = load_report(out)
    assert report["mode"] == "synthetic"
    phases = check_common(report, out)
    # no latency in a simulation
    assert all(p["ls_p99_ms"] is None and p["latency_samples"] == 0 for p in phases.values())
    # LS 2 probes × 1/5 = 0.4 cores; BE 2 burners take 2 cores with the shares only
    assert phases["ls-alone"]["ls_cpu_cores"] == pytest.approx(0.4, abs=0.1)
    assert phases["shares-only"]["be_cpu_cores"] == pytest.approx(2.0, abs=0.15)
    # 4 CPUs × 40 % − 0.4 LS − 0.1 system = 1.1 cores for BE
    assert phases["koordqos"]["be_cpu_cores"] < phases["shares-only"]["be_cpu_cores"] - 0.5
    quotas = [p["quota"] for p in report["points"] if p["phase"] == "koordqos"]
    settled = sorted(quotas[len(quotas) // 2 :])[len(quotas[len(quotas) // 2 :]) // 2]  # median, 2nd half
    assert 80_000 <= settled <= 140_000, quotas  # ≈ 110000, read through the simulation's jitter
    assert any(v.startswith("Synthetic node") for v in report["summary"]["verdict"])
    assert report["scratch"]["removed"] is None
    assert "LS + BE, koordqos" in stdout


@pytest.fixture
def real_kernel() -> Iterator[None]:
    """Root and a writable hierarchy, and this machine's real-kernel demo tests one at a time.

    Their scratch trees are machine-wide: the start of a second pytest's demo would sweep the tree a killed
    demo left for this test's next demo to remove, and its trees would look like this test's.
    """
    reason = unavailable_reason()
    if reason:
        print(f"skipping the real-kernel demo: {reason}")
        pytest.skip(reason)
    with REAL_DEMO_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


@pytest.mark.cgroupv1
@pytest.mark.usefixtures("real_kernel")
def test_real_kernel_demo_measures_latency_and_removes_its_cgroups(tmp_path: Path) -> None:
    before = scratch_dirs()
    out = tmp_path / "report"
    flags = [
        "--phase-seconds",
        "3",
        "--interval",
        "0.5",
        "--root-shares",
        "262144",
        "--sample-interval",
        "0.5",
        *SHORT,
    ]
    rc, stdout, stderr = demo(out, *flags)
    assert rc == 0, stderr
    report = load_report(out)
    assert report["mode"] == "real"
    phases = check_common(report, out)
    for p in phases.values():
        assert p["latency_samples"] > 50
        # a slot is at least the work it does (calibrated on this machine; 1 ms nominal)
        assert p["ls_p50_ms"] > 0.3
        assert p["ls_p99_ms"] >= p["ls_p50_ms"]
    assert phases["shares-only"]["be_cpu_cores"] > 0.05  # the streamers ran
    assert report["machine"]["ls_cpus"]
    assert report["machine"]["be_cpus"]
    if report["machine"]["cpus"] > 1:  # the probes on their own CPU(s), BE and the demo on the others
        assert not set(report["machine"]["ls_cpus"]) & set(report["machine"]["be_cpus"])
    name = report["scratch"]["name"]
    assert name.startswith("koordqos-demo-")
    assert report["scratch"]["removed"] is True
    assert name not in scratch_dirs()
    assert not left_behind(before)
    assert f"{name}: removed" in stdout


@pytest.mark.cgroupv1
@pytest.mark.usefixtures("real_kernel")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_real_demo_still_removes_its_cgroups(tmp_path: Path, sig: signal.Signals) -> None:
    before = scratch_dirs()
    # the probes run inside the tree (it is in use: removal must kill them first)
    proc, name = _start_real_demo(tmp_path, before)
    try:
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        _out, err = proc.communicate(timeout=30)
    assert rc == 130, err
    assert "interrupted" in err
    assert name not in scratch_dirs()
    assert not left_behind(before)
    report = load_report(tmp_path)
    assert report["error"].startswith("interrupted")
    assert report["scratch"]["removed"] is True
    # an occupied cgroup cannot be removed: no probe or burner outlived the demo in it


def _start_real_demo(out: Path, before: set[str]) -> tuple[subprocess.Popen[str], str]:
    """A real-kernel demo subprocess, once its scratch tree exists and its probes run inside it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "koordqos", "demo", "--no-live", "--out", str(out), "--phase-seconds=30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # its own tree, by the owner in the name: another demo (a second pytest) may make one meanwhile
        wait_until_sync(lambda: bool(owned_by(proc.pid)), 60, 0.05, "the demo's scratch tree")
        (name,) = owned_by(proc.pid)
        assert name not in before
        probes = REAL_ROOT / "cpu" / name / "kubepods" / "burstable"

        def probes_running() -> bool:
            files = list(probes.glob("pod*/probe/cgroup.procs"))
            return bool(files) and bool(files[0].read_text().split())

        wait_until_sync(probes_running, 60, 0.05, "the probes in their cgroup")
    except BaseException:
        proc.kill()
        proc.communicate(timeout=30)
        raise
    return proc, name


@pytest.mark.cgroupv1
@pytest.mark.usefixtures("real_kernel")
def test_a_killed_demos_cgroups_are_removed_at_the_next_demo_start(tmp_path: Path) -> None:
    before = scratch_dirs()
    workdirs = set(Path("/tmp").glob("kqdemo-*"))
    proc, name = _start_real_demo(tmp_path / "killed", before)
    proc.kill()  # SIGKILL: no handler, no atexit, nothing of the demo cleans up
    proc.communicate(timeout=30)
    # its work directory: a real-kernel demo's (mount points under cgroup/), not that of a synthetic demo
    # another worker started meanwhile (node/), which must be left alone
    killed_workdirs = {w for w in set(Path("/tmp").glob("kqdemo-*")) - workdirs if (w / "cgroup").is_dir()}
    assert name in scratch_dirs()
    assert name.startswith(f"koordqos-demo-{proc.pid}-")  # the tree names its owner
    try:
        # a short run (its agent fails at once): the sweep runs at its start
        rc, stdout, stderr = demo(tmp_path / "next", "--phase-seconds", "1", "--agent-arg=--no-such-flag")
    finally:
        sweep_stale()  # whatever happened above, leave no tree of the killed demo behind
        for workdir in killed_workdirs:  # nor its work directory (socket, bind-mount points) in /tmp
            shutil.rmtree(workdir, ignore_errors=True)
    assert rc == 1, stderr
    assert f"removed stale scratch cgroups {name} (its demo process is gone)" in stdout
    assert name not in scratch_dirs()
    assert not left_behind(before)


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


@pytest.mark.cgroupv1
@pytest.mark.usefixtures("real_kernel")
def test_a_failing_agent_ends_the_demo_with_an_error_and_no_cgroups_left(tmp_path: Path) -> None:
    before = scratch_dirs()
    rc, _stdout, stderr = demo(tmp_path, "--phase-seconds", "1", "--agent-arg=--no-such-flag")
    assert rc == 1
    assert "the agent exited with 2" in stderr
    report = load_report(tmp_path)
    assert "the agent exited with 2" in report["error"]
    assert report["scratch"]["removed"] is True
    assert report["phases"] == []  # the agent starts before anything is measured
    assert not left_behind(before)
