"""The cgroup v2 suite: gating on the host, and the guest tests collected only inside the VM.

On the host (cgroup v1) the suite runs when KOORDQOS_E2E_CGROUPV2 is set (`nox -s e2e-cgroupv2` sets it):
`1` boots the VM (tools/v2vm/run.py) and skips with the reason when it cannot run here (no qemu, kernel or
static busybox); `require` fails instead (.ci/run). Unset, the host test is skipped with a printed reason.
The guest tests (guest/) write the real /sys/fs/cgroup: they are collected only inside the VM, where
tools/v2vm/run.py sets V2VM=1.
"""

from __future__ import annotations

import os

import pytest

MODE_ENV = "KOORDQOS_E2E_CGROUPV2"

# the guest side is the VM's business: never collected on the host (nor the VM-booting test in the VM)
collect_ignore = ["test_v2vm.py"] if os.environ.get("V2VM") == "1" else ["guest"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get(MODE_ENV, "") in {"1", "require"} or os.environ.get("V2VM") == "1":
        return
    skip = pytest.mark.skip(
        reason=f"cgroup v2 VM suite: `python -m nox -s e2e-cgroupv2` boots the VM and runs it ({MODE_ENV}=1)"
    )
    for item in items:
        if "e2e_cgroupv2" in item.keywords:
            item.add_marker(skip)
