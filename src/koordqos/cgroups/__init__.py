"""koordqos.cgroups: the cgroup file layer (layout, resource registry, executor, reader).

Services put on the AgentContext by `setup`:
* "cgroup_layout": `CgroupLayout` (version/driver detected under --cgroup-root; dir naming; capabilities)
* "executor": `CgroupExecutor` (applies `CgroupWrite` intents; dry-run aware; decision log)
* "cgroup_reader": `CgroupReader` (usage counters and settings of cgroup dirs)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome, WriteResult
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout, parse_container_id
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component

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
    "parse_container_id",
    "setup",
]


def setup(ctx: AgentContext) -> list[Component]:
    """Detect the cgroup layout and put the layout, executor and reader on `ctx.services`."""
    paths = ctx.config.paths
    layout = CgroupLayout.detect(
        paths.cgroup_root,
        proc_root=paths.proc_root,
        sys_root=paths.sys_root,
        crio_cgroupfs_bare_ids=paths.crio_cgroupfs_bare_ids,
    )
    executor = CgroupExecutor(
        layout,
        ctx.decisions,
        force_update_seconds=ctx.config.executor.resource_force_update_seconds,
        dry_run=ctx.config.dry_run or None,
    )
    ctx.services["cgroup_layout"] = layout
    ctx.services["executor"] = executor
    ctx.services["cgroup_reader"] = CgroupReader(layout)
    ctx.status["cgroups"] = {
        "root": str(layout.root),
        "version": str(layout.version),
        "driver": str(layout.driver),
        "hybrid": layout.hybrid,
    }
    return []
