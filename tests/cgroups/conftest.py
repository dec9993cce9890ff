"""Fixtures: synthetic cgroup trees (v1/v2 × systemd/cgroupfs); scratch cgroups on the real v1 hierarchy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.scratchcg import Scratch, unavailable_reason

COMBOS = [
    (CgroupVersion.V1, CgroupDriver.CGROUPFS),
    (CgroupVersion.V1, CgroupDriver.SYSTEMD),
    (CgroupVersion.V2, CgroupDriver.CGROUPFS),
    (CgroupVersion.V2, CgroupDriver.SYSTEMD),
]


@pytest.fixture(params=COMBOS, ids=lambda c: f"{c[0]}-{c[1]}")
def node(request: pytest.FixtureRequest, tmp_path: Path) -> SyntheticNode:
    """A synthetic node for each cgroup version and driver."""
    version, driver = request.param
    return SyntheticNode(tmp_path, version, driver)


@pytest.fixture
def scratch() -> Iterator[Scratch]:
    """Scratch cgroups on the real v1 hierarchy, removed afterwards even when the test fails."""
    reason = unavailable_reason()
    if reason:
        print(f"skipping real cgroup v1 test: {reason}")
        pytest.skip(reason)
    s = Scratch()
    try:
        s.mkcg("")
    except OSError as exc:
        s.cleanup()
        print(f"skipping real cgroup v1 test: cannot create scratch cgroup: {exc}")
        pytest.skip(f"cannot create scratch cgroup: {exc}")
    try:
        yield s
    finally:
        s.cleanup()
