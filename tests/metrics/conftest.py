"""Fixtures: synthetic nodes for each cgroup version and driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.testing.nodefs import SyntheticNode

COMBOS = [(v, d) for v in CgroupVersion for d in CgroupDriver]


@pytest.fixture(params=COMBOS, ids=lambda c: f"{c[0]}-{c[1]}")
def node(request: pytest.FixtureRequest, tmp_path: Path) -> SyntheticNode:
    """A synthetic node for each cgroup version and driver."""
    version, driver = request.param
    return SyntheticNode(tmp_path, version, driver)
