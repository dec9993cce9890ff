"""koordqos.cgroups: the cgroup file layer (layout, resource registry, executor, reader).

The composer builds one `CgroupLayout` (version/driver detected under --cgroup-root; dir naming;
capabilities), one `CgroupExecutor` (applies `CgroupWrite` intents; dry-run aware; decision log) and one
`CgroupReader` (usage counters and settings of cgroup dirs) and hands them to whoever needs them.
"""

from __future__ import annotations

from typing import Any

from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome, WriteResult
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout, parse_container_id
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion

__all__ = [
    "CgroupDriver",
    "CgroupExecutor",
    "CgroupLayout",
    "CgroupReader",
    "CgroupVersion",
    "CgroupWrite",
    "Level",
    "Outcome",
    "WriteResult",
    "describe",
    "parse_container_id",
]


def describe(layout: CgroupLayout) -> dict[str, Any]:
    """The layout as /debug/state shows it."""
    return {
        "root": str(layout.root),
        "version": str(layout.version),
        "driver": str(layout.driver),
        "hybrid": layout.hybrid,
        "controller_links": layout.controllers.describe(),
    }
