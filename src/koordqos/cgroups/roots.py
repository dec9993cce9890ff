"""Start-up checks of the host roots: is `--cgroup-root` a cgroup hierarchy, do the roots exist, do its
controller links stay inside it, and which cgroup controllers that the enabled features write are missing.

A wrong root used to give an agent that reported ready and did nothing. Now: a missing root, or a cgroup
root with no hierarchy at all, is a start-up error (exit 2, one line naming the path); a hierarchy that lacks
a controller some enabled feature needs keeps `/readyz` at 503 with the reason (`missing_controllers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from koordqos.cgroups.controllers import check_controllers, resolve_controllers
from koordqos.errors import ConfigError

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio")

#: Controllers each feature gate writes or reads (v1 subsystem names; v2 folds cpuacct into cpu).
FEATURE_CONTROLLERS: Mapping[str, tuple[str, ...]] = {
    "BECPUSuppress": ("cpu", "cpuset"),
    "BECPUEvict": ("cpu", "cpuacct"),
    "CPUEvict": ("cpu", "cpuacct"),
    "CPUAllocatableEvict": ("cpu", "cpuacct"),
    "BEMemoryEvict": ("memory",),
    "MemoryEvict": ("memory",),
    "MemoryAllocatableEvict": ("memory",),
    "CPUBurst": ("cpu",),
    "CgroupReconcile": ("cpu", "memory"),
    "BlkIOReconcile": ("blkio",),
    "GroupIdentity": ("cpu",),
    "CPUSetAllocator": ("cpuset",),
    "BatchResource": ("cpu", "memory"),
    "CPUNormalization": ("cpu",),
    "CoreSched": ("cpu",),
}


def check_host_roots(cgroup_root: Path, proc_root: Path, sys_root: Path) -> None:
    """ConfigError naming the first unusable root: missing, not a directory, or no cgroup hierarchy."""
    for flag, path in (("--cgroup-root", cgroup_root), ("--proc-root", proc_root), ("--sys-root", sys_root)):
        if not path.exists():
            raise ConfigError(f"{flag} {path}: does not exist")
        if not path.is_dir():
            raise ConfigError(f"{flag} {path}: not a directory")
    if not (cgroup_root / "cgroup.controllers").is_file() and not any(
        (cgroup_root / c).is_dir() for c in V1_CONTROLLERS
    ):
        raise ConfigError(
            f"--cgroup-root {cgroup_root}: no cgroup hierarchy (neither cgroup.controllers of v2 nor a v1 "
            f"controller directory such as cpu/ or memory/)"
        )
    if not (cgroup_root / "cgroup.controllers").is_file():
        # v1 / hybrid: a controller link (systemd's cpu -> cpu,cpuacct) must stay inside the root
        check_controllers(cgroup_root, resolve_controllers(cgroup_root))


def available_controllers(cgroup_root: Path) -> frozenset[str]:
    """Controllers the hierarchy offers: v2 `cgroup.controllers` (cpu includes cpuacct), else v1 dirs."""
    listing = cgroup_root / "cgroup.controllers"
    if listing.is_file():
        try:
            names = set(listing.read_text().split())
        except OSError:
            names = set()
        if "cpu" in names:
            names.add("cpuacct")
        if "io" in names:
            names.add("blkio")
        return frozenset(names)
    return frozenset(c for c in V1_CONTROLLERS if (cgroup_root / c).is_dir())


def missing_controllers(cgroup_root: Path, gates: Mapping[str, bool]) -> dict[str, list[str]]:
    """{missing controller: [enabled features needing it]}; {} when everything needed is there."""
    have = available_controllers(cgroup_root)
    out: dict[str, list[str]] = {}
    for gate, controllers in FEATURE_CONTROLLERS.items():
        if not gates.get(gate, False):
            continue
        for controller in controllers:
            if controller not in have:
                out.setdefault(controller, []).append(gate)
    return out


def readiness_reason(missing: Mapping[str, list[str]]) -> str:
    """One line for /readyz: which controller is missing for which features."""
    parts = [f"{c} (needed by {', '.join(sorted(g))})" for c, g in sorted(missing.items())]
    return "cgroup controllers missing: " + "; ".join(parts)
