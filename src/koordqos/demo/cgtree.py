"""The scratch pod tree on this machine's real cgroup hierarchy (v1 per-controller dirs, or v2 unified).

```
<scratch>/                             koordqos-demo-<pid>-<start>-<hex>; the agent's cgroup root
<scratch>/system                       the agent process (a node's system part)
<scratch>/demo                         the demo process itself while it runs (so it is not starved either)
<scratch>/kubepods/burstable/pod<ls>/probe    the LS probes
<scratch>/kubepods/besteffort/pod<be>/burner  the BE burners
```
On a hybrid v1 node (systemd's cgroup v2 mount at `unified/`, no controller attached) the tree is mirrored
there too, as runc mirrors pod cgroups, so the kernel keeps each pod's pressure (PSI) files: what the agent's
PSI rule and the benchmark's stall figures read.
cpu.shares (v1) / cpu.weight (v2) are set as kubelet sets them (besteffort 2, burstable pods by request),
and the scratch dir itself can get a large share so the rest of the machine does not starve the probes.
`cleanup()` kills whatever still runs inside and removes every dir, deepest first.

The name carries the owning demo process (pid and its start time in clock ticks since boot, so a reused pid
is not taken for the owner). A SIGKILLed demo cannot clean up; `sweep_stale()`, run at every real-kernel
demo start, removes the trees whose owner is gone (what still runs inside them, e.g. an orphaned agent, is
killed first). Trees of a live demo, and dirs of any other name, are left alone.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.cgroups.resources import CgroupVersion
from koordqos.testing.scratchcg import REAL_SUBSYSTEMS, Scratch, remove_tree
from koordqos.testing.scratchcg import unavailable_reason as v1_unavailable_reason

REAL_ROOT = Path("/sys/fs/cgroup")
V2_CONTROLLERS = ("cpu", "cpuset", "memory")
LS_UID = "6c5d0a0e-1f2b-4d3c-9e8f-7a6b5c4d3e2f"
BE_UID = "0b1e2d3c-4f5a-4b6c-8d7e-9f0a1b2c3d4e"
LS_CONTAINER = "probe"
BE_CONTAINER = "burner"
MAX_SHARES = 262144
CFS_PERIOD = 100_000


UNIFIED = "unified"  # hybrid's cgroup v2 mount beside the v1 controllers
NAME_PREFIX = "koordqos-demo-"
_NAME_RE = re.compile(r"^koordqos-demo-(\d+)-(\d+)-[0-9a-f]+$")


def process_start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/<pid>/stat field 22); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parens: fields after the last ")" start at field 3
    try:
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def scratch_name(pid: int | None = None) -> str:
    """A unique scratch tree name owned by `pid` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{NAME_PREFIX}{pid}-{process_start_ticks(pid) or 0}-{uuid.uuid4().hex[:8]}"


def owner_alive(name: str) -> bool | None:
    """Whether the demo that made tree `name` still runs; None for a name that records no owner."""
    found = _NAME_RE.match(name)
    if found is None:
        return None
    pid, ticks = int(found[1]), int(found[2])
    return process_start_ticks(pid) == ticks


def has_unified(root: Path = REAL_ROOT) -> bool:
    """Whether `root` is hybrid: v1 controllers with a cgroup v2 hierarchy at `unified/`."""
    return (root / UNIFIED / "cgroup.controllers").exists() and not (root / "cgroup.controllers").exists()


def v1_bases(root: Path) -> list[Path]:
    """Where a v1 scratch tree has a copy: each controller's mount, and `unified/` on a hybrid node."""
    return [root / c for c in REAL_SUBSYSTEMS] + ([root / UNIFIED] if has_unified(root) else [])


def detect_version(root: Path = REAL_ROOT) -> CgroupVersion | None:
    """v2 when the root is a unified hierarchy, v1 when it holds a cpu controller dir, else None."""
    if (root / "cgroup.controllers").exists():
        return CgroupVersion.V2
    if (root / "cpu" / "cgroup.procs").exists():
        return CgroupVersion.V1
    return None


def unavailable_reason(root: Path = REAL_ROOT) -> str | None:
    """Why the real-kernel demo cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "not running as root"
    version = detect_version(root)
    if version is None:
        return f"no cgroup v1 or v2 hierarchy at {root}"
    if version is CgroupVersion.V1:
        return v1_unavailable_reason(root)
    if not os.access(root, os.W_OK):
        return f"{root} is not writable"
    delegated = (root / "cgroup.subtree_control").read_text().split()
    missing = [c for c in V2_CONTROLLERS if c not in delegated]
    if missing:
        return f"{root} does not delegate the {', '.join(missing)} controller(s) to its children"
    return None


@dataclass
class PodTree:
    """The scratch tree (see the module docstring) and the operations the demo needs on it."""

    name: str = field(default_factory=scratch_name)
    root: Path = REAL_ROOT
    version: CgroupVersion = CgroupVersion.V1
    made: list[str] = field(default_factory=list)

    # -- relative dirs (from the real root) -------------------------------------------------------------

    @property
    def system_dir(self) -> str:
        """The agent's cgroup."""
        return f"{self.name}/system"

    @property
    def demo_dir(self) -> str:
        """The demo process's cgroup while it runs."""
        return f"{self.name}/demo"

    @property
    def be_qos_dir(self) -> str:
        """kubepods/besteffort: where CPU suppress writes the quota."""
        return f"{self.name}/kubepods/besteffort"

    @property
    def ls_pod_dir(self) -> str:
        """The LS pod."""
        return f"{self.name}/kubepods/burstable/pod{LS_UID}"

    @property
    def be_pod_dir(self) -> str:
        """The BE pod."""
        return f"{self.name}/kubepods/besteffort/pod{BE_UID}"

    @property
    def ls_container_dir(self) -> str:
        """The probes' container."""
        return f"{self.ls_pod_dir}/{LS_CONTAINER}"

    @property
    def be_container_dir(self) -> str:
        """The burners' container."""
        return f"{self.be_pod_dir}/{BE_CONTAINER}"

    def controller_dir(self, rel: str, controller: str) -> Path:
        """Absolute dir of `rel` for a controller (v1: under the controller's mount)."""
        if self.version is CgroupVersion.V1:
            return self.root / controller / rel
        return self.root / rel

    @property
    def hybrid(self) -> bool:
        """v1 with a unified mirror (see the module docstring)."""
        return self.version is CgroupVersion.V1 and has_unified(self.root)

    def mount_sources(self) -> dict[str, Path]:
        """What the agent's cgroup root is made of: v1 {controller: scratch dir} (and {"unified": its
        mirror} on a hybrid node), v2 {"": scratch dir}."""
        if self.version is CgroupVersion.V1:
            return {b.name: b / self.name for b in v1_bases(self.root)}
        return {"": self.root / self.name}

    def pressure_file(self, rel: str, resource: str = "cpu") -> Path | None:
        """`rel`'s `<resource>.pressure` (v2: in the hierarchy; hybrid: in the unified mirror); None on a
        plain v1 node, whose cgroups have none."""
        if self.version is CgroupVersion.V2:
            return self.root / rel / f"{resource}.pressure"
        if self.hybrid:
            return self.root / UNIFIED / rel / f"{resource}.pressure"
        return None

    # -- building -----------------------------------------------------------------------------------------

    def create(self, cpus: int, ls_request_milli: int, root_shares: int | None = None) -> None:
        """Make the tree and set kubelet-like CPU shares; the scratch dir gets `root_shares` if given."""
        for rel in (
            "",
            "system",
            "demo",
            "kubepods",
            "kubepods/burstable",
            f"kubepods/burstable/pod{LS_UID}",
        ):
            self._mkdir(rel)
        self._mkdir(f"kubepods/burstable/pod{LS_UID}/{LS_CONTAINER}")
        for rel in ("kubepods/besteffort", f"kubepods/besteffort/pod{BE_UID}"):
            self._mkdir(rel)
        self._mkdir(f"kubepods/besteffort/pod{BE_UID}/{BE_CONTAINER}")
        if root_shares is not None:
            self.set_shares(self.name, root_shares)
        self.set_shares(f"{self.name}/kubepods", cpus * 1024)
        self.set_shares(f"{self.name}/kubepods/besteffort", 2)
        self.set_shares(self.be_pod_dir, 2)
        self.set_shares(self.be_container_dir, 2)
        ls_shares = max(2, ls_request_milli * 1024 // 1000)
        self.set_shares(self.ls_pod_dir, ls_shares)
        self.set_shares(self.ls_container_dir, ls_shares)

    def _mkdir(self, rel: str) -> None:
        full = f"{self.name}/{rel}" if rel else self.name
        if self.version is CgroupVersion.V1:
            Scratch(self.name, self.root).mkcg(rel)
            if self.hybrid:
                (self.root / UNIFIED / full).mkdir()
        else:
            (self.root / full).mkdir()
        self.made.append(full)
        if (
            self.version is CgroupVersion.V2
            and rel not in ("system", "demo")
            and not rel.endswith((LS_CONTAINER, BE_CONTAINER))
        ):
            # inner dirs hand the controllers on; leaves (processes live there) do not
            enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
            (self.root / full / "cgroup.subtree_control").write_text(enable)

    def set_shares(self, rel: str, shares: int) -> None:
        """cpu.shares (v1) or the equivalent cpu.weight (v2, the kernel's own conversion)."""
        if self.version is CgroupVersion.V1:
            (self.controller_dir(rel, "cpu") / "cpu.shares").write_text(str(min(shares, MAX_SHARES)))
        else:
            weight = 1 + ((min(shares, MAX_SHARES) - 2) * 9999) // 262142
            (self.controller_dir(rel, "cpu") / "cpu.weight").write_text(str(weight))

    def add_process(self, rel: str, pid: int) -> None:
        """Move a process into `rel` (every v1 controller, or the v2 dir)."""
        for path in self.procs_files(rel):
            path.write_text(str(pid))

    def procs_files(self, rel: str) -> list[Path]:
        """The cgroup.procs files a pid is written to, to join `rel`."""
        if self.version is CgroupVersion.V1:
            return [b / rel / "cgroup.procs" for b in v1_bases(self.root)]
        return [self.root / rel / "cgroup.procs"]

    def own_cgroups(self) -> dict[Path, str]:
        """This process's current cgroups: {the cgroup.procs file that moves it back there: cgroup path}."""
        here: dict[Path, str] = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            names = controllers.split(",")
            if controllers == "" and (self.version is CgroupVersion.V2 or self.hybrid):
                base = self.root if self.version is CgroupVersion.V2 else self.root / UNIFIED
                here[base / path.lstrip("/") / "cgroup.procs"] = path
            for c in REAL_SUBSYSTEMS:
                if self.version is CgroupVersion.V1 and c in names:
                    here[self.root / c / path.lstrip("/") / "cgroup.procs"] = path
        return here

    def enter(self, rel: str) -> dict[Path, str]:
        """Move this process into `rel`; returns where it was (for `leave`)."""
        before = self.own_cgroups()
        self.add_process(rel, os.getpid())
        return before

    @staticmethod
    def leave(before: dict[Path, str]) -> None:
        """Move this process back to where `enter` found it."""
        for procs in before:
            procs.write_text(str(os.getpid()))

    # -- reading and setting ------------------------------------------------------------------------------

    def cpu_usage_seconds(self, rel: str) -> float:
        """Cumulative CPU time of `rel` and its children."""
        if self.version is CgroupVersion.V1:
            return int((self.controller_dir(rel, "cpuacct") / "cpuacct.usage").read_text()) / 1e9
        for line in (self.root / rel / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return 0.0

    def be_quota(self) -> int:
        """The besteffort dir's CFS quota in µs per 100 ms period (-1: unlimited)."""
        if self.version is CgroupVersion.V1:
            return int((self.controller_dir(self.be_qos_dir, "cpu") / "cpu.cfs_quota_us").read_text())
        quota = (self.root / self.be_qos_dir / "cpu.max").read_text().split()[0]
        return -1 if quota == "max" else int(quota)

    def set_be_quota(self, quota: int) -> None:
        """Set the besteffort quota by hand (-1: unlimited)."""
        if self.version is CgroupVersion.V1:
            (self.controller_dir(self.be_qos_dir, "cpu") / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            value = "max" if quota < 0 else str(quota)
            (self.root / self.be_qos_dir / "cpu.max").write_text(f"{value} {CFS_PERIOD}")

    # -- removing -----------------------------------------------------------------------------------------

    def pids(self) -> set[int]:
        """Every process still inside the tree."""
        found: set[int] = set()
        bases = list(self.mount_sources().values())
        for base in bases:
            if not base.exists():
                continue
            for dirpath, _dirs, files in os.walk(base):
                if "cgroup.procs" in files:
                    try:
                        text = (Path(dirpath) / "cgroup.procs").read_text()
                    except OSError:
                        continue
                    found.update(int(p) for p in text.split())
        return found

    def exists(self) -> bool:
        """Whether any dir of the tree is left."""
        return any(p.exists() for p in self.mount_sources().values())

    def cleanup(self, timeout: float = 10.0) -> None:
        """Kill what still runs inside, then remove every dir (retrying while dying processes leave)."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids() - {os.getpid()}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                for base in self.mount_sources().values():
                    remove_tree(base)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # a killed process takes a moment to leave its cgroup


def stale_trees(root: Path = REAL_ROOT, version: CgroupVersion = CgroupVersion.V1) -> list[str]:
    """Names of the scratch trees under `root` whose owning demo process is gone (sorted)."""
    bases = v1_bases(root) if version is CgroupVersion.V1 else [root]
    names: set[str] = set()
    for base in bases:
        try:
            with os.scandir(base) as entries:
                names.update(
                    e.name
                    for e in entries
                    if e.name.startswith(NAME_PREFIX) and e.is_dir(follow_symlinks=False)
                )
        except OSError:
            continue
    return sorted(n for n in names if owner_alive(n) is False)


def sweep_stale(root: Path = REAL_ROOT, version: CgroupVersion = CgroupVersion.V1) -> list[str]:
    """Remove the scratch trees of demos that died without cleaning up (see the module docstring); returns
    their names. A tree that cannot be removed is reported on stderr and left."""
    removed = []
    for name in stale_trees(root, version):
        try:
            PodTree(name=name, root=root, version=version).cleanup()
        except OSError as exc:
            print(f"koordqos demo: cannot remove stale scratch cgroups {name}: {exc}", file=sys.stderr)
            continue
        removed.append(name)
    return removed
