"""Thread ids of a pod's cgroups (container and sandbox dirs): `tasks` on v1 (cpu), `cgroup.threads` on v2.

Read for resctrl task assignment. Every child dir of the pod dir counts (containers and the sandbox); a dir
that vanished meanwhile is skipped. Paths are confined by the layout (no symlinked dirs followed).
"""

from __future__ import annotations

import os

from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.errors import CgroupError


def pod_thread_ids(layout: CgroupLayout, pod_dir: str) -> list[int]:
    """Sorted thread ids in the pod dir and its direct child dirs ([] when the pod dir is missing)."""
    name = "tasks" if layout.version is CgroupVersion.V1 else "cgroup.threads"
    try:
        base = layout.subsystem_dir(pod_dir, "cpu")
    except CgroupError:
        return []
    dirs = [str(base)]
    try:
        dirs += [e.path for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    out: set[int] = set()
    for d in dirs:
        try:
            fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
        finally:
            os.close(fd)
        out.update(int(t) for t in data.split() if t.isdigit())
    return sorted(out)
