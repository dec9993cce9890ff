"""Scratch cgroups on the real cgroup v1 hierarchy for tests: uniquely named, removed afterwards."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion

REAL_ROOT = Path("/sys/fs/cgroup")
REAL_SUBSYSTEMS = ("cpu", "cpuacct", "cpuset", "memory")


def unavailable_reason(root: Path = REAL_ROOT) -> str | None:
    """Why scratch cgroups cannot be made here (None when they can)."""
    for sub in REAL_SUBSYSTEMS:
        d = root / sub
        if not (d / "cgroup.procs").exists():
            return f"{d} is not a mounted cgroup v1 hierarchy"
        if not os.access(d, os.W_OK):
            return f"{d} is not writable (need root)"
    return None


def remove_tree(d: Path) -> None:
    """rmdir a cgroup dir and its children, deepest first (cgroup dirs cannot be removed recursively)."""
    if not d.exists():
        return
    for dirpath, _dirs, _files in sorted(os.walk(d), key=lambda w: -w[0].count("/")):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass


@dataclass
class Scratch:
    """A scratch cgroup `name` in cpu, cpuacct, cpuset and memory of the real v1 hierarchy."""

    name: str = field(default_factory=lambda: f"koordqos-test-{uuid.uuid4().hex[:12]}")
    root: Path = REAL_ROOT
    made: list[str] = field(default_factory=list)

    @property
    def layout(self) -> CgroupLayout:
        """A cgroupfs v1 layout of the real root."""
        return CgroupLayout(self.root, CgroupVersion.V1, CgroupDriver.CGROUPFS)

    def hierarchies(self) -> list[str]:
        """The subsystems to make dirs in, one per mounted hierarchy (systemd co-mounts cpu and cpuacct
        behind links: `cpu,cpuacct` is one hierarchy, made once)."""
        seen: set[str] = set()
        out = []
        for sub in REAL_SUBSYSTEMS:
            real = os.path.realpath(self.root / sub)
            if real not in seen:
                seen.add(real)
                out.append(sub)
        return out

    def mkcg(self, rel: str) -> str:
        """Create `name/rel` in every hierarchy (cpuset dirs get their parent's cpus and mems first)."""
        full = f"{self.name}/{rel}" if rel else self.name
        for sub in self.hierarchies():
            d = self.root / sub / full
            d.mkdir()
            if sub == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((d.parent / f).read_text())
        self.made.append(full)
        return full

    def path(self, rel: str, subsystem: str, name: str) -> Path:
        """Absolute path of a file in a cgroup dir (rel from the hierarchy root)."""
        return self.root / subsystem / rel / name

    def read(self, rel: str, subsystem: str, name: str) -> str:
        """Stripped content of a real cgroup file."""
        return self.path(rel, subsystem, name).read_text().strip()

    def cleanup(self) -> None:
        """Remove every scratch dir."""
        for sub in self.hierarchies():
            remove_tree(self.root / sub / self.name)
