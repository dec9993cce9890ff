"""What the e2e-runtime suites need from the machine, and the runtime build (setup.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from koordqos.testing import scratchcg

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SETUP = HERE / "setup.sh"
RUN_ENV = "KOORDQOS_E2E_RUNTIME"  # "1" runs the suites (nox -s e2e-runtime sets it)
REQUIRED_ENV = "KOORDQOS_E2E_RUNTIME_REQUIRED"  # "1": a missing prerequisite fails instead of skipping
POLL = 0.1  # seconds between polls: each one may run crictl or read several cgroup files


class Unavailable(Exception):
    """The real runtime cannot run here; the message is the skip reason."""


# -- prerequisites and the build -----------------------------------------------------------------------


def missing_prerequisite() -> str | None:
    """Why the real runtime cannot run on this machine (None when it can)."""
    if os.geteuid() != 0:
        return "not root: containerd, runc and real cgroup writes need uid 0"
    if shutil.which("go") is None:
        return "no Go toolchain on PATH: containerd and crictl are built with `go install`"
    reason = scratchcg.unavailable_reason()
    if reason is not None:
        return f"no writable cgroup v1: {reason}"
    for tool in ("unshare", "mount", "gcc"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            return "the kernel has no overlayfs (the snapshotter containerd uses)"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    return None


@dataclass(frozen=True)
class Toolchain:
    """Paths printed by setup.sh."""

    values: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.values[key]


def build_toolchain(timeout: float = 3600.0) -> Toolchain:
    """Run setup.sh (cached by version: seconds once built); Unavailable with its error line on failure."""
    try:
        proc = subprocess.run(
            ["bash", str(SETUP)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHON": sys.executable},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(f"setup.sh did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        said = [ln for ln in lines if ln.startswith("e2e-runtime setup:")]
        detail = (said or lines or ["(no output)"])[-1]
        tail = " | ".join(lines[-4:]) if not said else ""
        raise Unavailable(f"the runtime build failed: {detail}{' | ' + tail if tail else ''}")
    values = dict(ln.split("=", 1) for ln in proc.stdout.splitlines() if "=" in ln)
    return Toolchain(values)
