"""Cgroup dirs of NodeSLO host applications (`spec.hostApplications[].cgroupPath`).

The dir is `<base>/<parentDir>/<relativePath>` relative to the cgroup root, where base is the root itself
(`CgroupRoot`), kubepods, or the burstable / besteffort QoS dir of the node's layout. The parts come from
the NodeSLO, so they are confined like pod data: `..`, NUL bytes and paths resolving (through symlinks)
outside the cgroup root are refused with `PathEscapeError`. A leading `/` in a part is the cgroup root
(koordlet joins the parts as paths), not the host's root.
"""

from __future__ import annotations

from koordqos.cgroups.layout import CgroupLayout, check_relative
from koordqos.cgroups.resources import CgroupVersion
from koordqos.errors import CgroupError
from koordqos.model.nodeslo import CgroupPath
from koordqos.model.qos import KubeQoS

# subsystems the collector reads a host application's counters from (v1 checks each hierarchy)
MEASURED_SUBSYSTEMS = ("cpu", "cpuacct", "memory")


def base_dir(layout: CgroupLayout, base: str) -> str:
    """Relative dir of a CgroupPath base ("" for CgroupRoot)."""
    if base == "Kubepods":
        return layout.qos_dir(KubeQoS.GUARANTEED)
    if base == "KubepodsBurstable":
        return layout.qos_dir(KubeQoS.BURSTABLE)
    if base == "KubepodsBesteffort":
        return layout.qos_dir(KubeQoS.BESTEFFORT)
    if base == "CgroupRoot":
        return ""
    raise CgroupError(f"unknown cgroupPath.base {base!r}")


def host_app_dir(layout: CgroupLayout, path: CgroupPath) -> str:
    """The checked, confined relative dir of a host application (CgroupError / PathEscapeError if not)."""
    relative = check_relative(path.relative_path.lstrip("/"))
    if not relative:
        raise CgroupError("cgroupPath.relativePath is empty (the app would be its whole base dir)")
    parent = check_relative(path.parent_dir.lstrip("/"))
    rel = "/".join(p for p in (base_dir(layout, path.base), parent, relative) if p)
    subsystems = MEASURED_SUBSYSTEMS if layout.version is CgroupVersion.V1 else MEASURED_SUBSYSTEMS[:1]
    for subsystem in subsystems:
        layout.check_dir(rel, subsystem)  # advisory: a clear refusal now; every open is confined anyway
    return rel
