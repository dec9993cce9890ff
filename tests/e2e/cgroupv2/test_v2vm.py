"""The guest suite (guest/) on a real cgroup v2 kernel: tools/v2vm/run.py boots the VM once per session and
runs it there with pytest; each guest test is a test here, passed when it passed in the VM.

The VM sees this machine's root read-only (writes go to a tmpfs), so the interpreter running this test and
the repository are the guest's too. Their bytecode is compiled here first: under qemu's TCG (no usable
KVM) compiling ~5,000 modules in the guest, every run, would cost more than the whole suite.
"""

from __future__ import annotations

import ast
import compileall
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import MODE_ENV

pytestmark = pytest.mark.e2e_cgroupv2

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RUN = REPO / "tools" / "v2vm" / "run.py"
GUEST = HERE / "guest"
UNAVAILABLE = 125  # run.py: the VM could not run the command
HOST_TMP_CONTENT = "written on the host"  # read back in the guest (test_cgroups_v2)
TIMEOUT = 900.0  # seconds: under TCG on a loaded 2-CPU host the suite takes ~1 min; qemu is killed after this


def guest_tests() -> list[str]:
    """`<module>::<test>` of every test function in guest/ (read from the source: the guest modules are
    not imported on the host)."""
    out = []
    for path in sorted(GUEST.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                out.append(f"{path.stem}::{node.name}")
    return out


@dataclass
class Case:
    outcome: str  # passed, failed, error, skipped
    message: str = ""


@dataclass
class GuestRun:
    """One VM run of the guest suite."""

    rc: int
    stdout: str
    stderr: str
    seconds: float
    cases: dict[str, Case] = field(default_factory=dict)

    def tail(self, lines: int = 40) -> str:
        return "\n".join([*self.stdout.splitlines()[-lines:], *self.stderr.splitlines()[-8:]])


def _cases(junit: Path) -> dict[str, Case]:
    out: dict[str, Case] = {}
    if not junit.is_file():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rpartition(".")[2]
        name = f"{module}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                message = f"{child.get('message', '')}\n{child.text or ''}".strip()
                break
        out[name] = Case(outcome, message)
    return out


def _compile_bytecode() -> None:
    """Bytecode of this interpreter's packages, the sources and the tests (seconds once done)."""
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")} | {
        str(REPO / "src"),
        str(REPO / "tests"),
    }
    for path in sorted(paths):
        compileall.compile_dir(path, quiet=2)  # one process: a no-op pass takes 0.3 s, a pool 3 s


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> GuestRun:
    mode = os.environ.get(MODE_ENV, "")
    xfer = tmp_path_factory.mktemp("v2vm")
    # a file under the host's /tmp (not $TMPDIR), which the guest must see: a checkout or venv may live there
    host_tmp = Path(tempfile.mkdtemp(prefix="koordqos-v2vm-", dir="/tmp"))
    marker = host_tmp / "marker"
    marker.write_text(HOST_TMP_CONTENT)
    t0 = time.monotonic()
    _compile_bytecode()
    compiled = time.monotonic() - t0
    cmd = [
        sys.executable,
        str(RUN),
        "--xfer",
        str(xfer),
        "--timeout",
        str(TIMEOUT),
        "--cwd",
        str(REPO),
        "--env",
        f"V2VM_HOST_TMP_MARKER={marker}",
        "--",
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:hypothesispytest",  # ~10 s of imports under TCG, and no guest test uses it
        "-q",
        "-rA",
        "--color=no",
        "--durations=5",
        "--junitxml=/run/v2vm/xfer/guest.xml",
        "tests/e2e/cgroupv2/guest",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=TIMEOUT + 60)
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)
    run = GuestRun(
        proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0, _cases(xfer / "guest.xml")
    )
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("v2vm:")]
    print(f"bytecode compiled in {compiled:.1f} s; VM run {run.seconds - compiled:.1f} s")
    print("\n".join(said))
    print(proc.stdout)
    if proc.returncode == UNAVAILABLE and any("cannot run the VM" in ln for ln in said):
        reason = next(ln for ln in said if "cannot run the VM" in ln)
        if mode == "require":
            pytest.fail(
                f"cgroup v2 VM required ({MODE_ENV}=require) but unavailable: {reason}", pytrace=False
            )
        pytest.skip(reason)
    return run


def test_the_guest_suite_ran_and_passed(guest: GuestRun) -> None:
    booted = re.search(r"booted in ([0-9.]+) s", guest.stderr)
    assert booted is not None, f"the VM did not start the guest suite:\n{guest.tail()}"
    assert guest.rc == 0, f"the guest suite exited {guest.rc}:\n{guest.tail()}"
    assert set(guest.cases) == set(guest_tests()), (sorted(guest.cases), guest_tests())


@pytest.mark.parametrize("name", guest_tests())
def test_in_the_v2_vm(guest: GuestRun, name: str) -> None:
    case = guest.cases.get(name)
    assert case is not None, f"{name} did not run in the VM (exit code {guest.rc}):\n{guest.tail()}"
    # nothing may skip in the VM: it is the one place these paths run on a real v2 kernel
    assert case.outcome == "passed", f"{name} {case.outcome} in the VM:\n{case.message}"
