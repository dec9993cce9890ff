"""Thread ids of a pod's cgroups (container and sandbox dirs): `tasks` on v1 (cpu), `cgroup.threads` on v2.

Read for resctrl task assignment. Every child dir of the pod dir counts (containers and the sandbox); a dir
that vanished meanwhile is skipped. Every dir is listed and every file opened beneath the cgroup root with
no symlink followed (`koordqos.fs`), at the open itself: a pod dir swapped for a symlink to another cgroup
does not hand that cgroup's threads to a resctrl group.
"""

from __future__ import annotations

import os

from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.errors import CgroupError, UnsafePathError
from koordqos.fs import READ_FLAGS, open_beneath, subdirs_beneath


def pod_thread_ids(layout: CgroupLayout, pod_dir: str) -> list[int]:
    """Sorted thread ids in the pod dir and its direct child dirs ([] when the pod dir is missing)."""
    name = "tasks" if layout.version is CgroupVersion.V1 else "cgroup.threads"
    try:
        base = layout.subsystem_rel(pod_dir, "cpu")
        dirs = [base] + [f"{base}/{c}" if base else c for c in subdirs_beneath(layout.root, base)]
    except (OSError, CgroupError, UnsafePathError):
        return []
    out: set[int] = set()
    for d in dirs:
        try:
            fd = open_beneath(layout.root, f"{d}/{name}" if d else name, READ_FLAGS)
        except (OSError, UnsafePathError):
            continue
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
        except OSError:
            continue
        finally:
            os.close(fd)
        out.update(int(t) for t in data.split() if t.isdigit())
    return sorted(out)
