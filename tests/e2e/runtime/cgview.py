"""The scratch cgroup tree and the private view in which it is the whole cgroup hierarchy.

A uniquely named `koordqos-e2e-<hex>` dir in every hierarchy; containerd (with its shims and runc) and the
agent start through `CgroupTree.wrap`, which joins that dir, unshares a cgroup and a mount namespace and
bind-mounts the dir over `/sys/fs/cgroup/<hierarchy>`. Pods use the ordinary cgroupfs parent
`/kubepods/besteffort/pod<uid>`, the agent runs with `--cgroup-root /sys/fs/cgroup`, both agree on every dir
as on a real node, and neither can reach a cgroup outside the scratch tree. The tests read the same kernel
files from the host's side (`/sys/fs/cgroup/<hierarchy>/koordqos-e2e-<hex>/...`).

Two layouts of that view (`CgroupTree.layout`):

* `separate` (this machine's own): every hierarchy's dir bound over its mount point, names unchanged.
* `systemd` (Ubuntu 20.04, CentOS 7/8, Anolis 8, Debian 10): in the namespace a new tmpfs is built aside
  (in the stack's temp dir), the hierarchies are bound into it, the cpu hierarchy at `cpu,cpuacct` with
  `cpu -> cpu,cpuacct` a symlink, and the tmpfs is then moved over `/sys/fs/cgroup`; the host's tmpfs is
  never written. A hierarchy cannot be mounted again with another controller set, so only the cpu hierarchy
  is at the co-mounted name here: `cpuacct` stays a real mount of its own (the cpu-only hierarchy has no
  `cpuacct.usage`), and `net_cls,net_prio` appear only when the host has those hierarchies (see
  `SYSTEMD_COMOUNTS`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from koordqos.testing import scratchcg

CGROUP_MNT = Path("/sys/fs/cgroup")

Layout = Literal["separate", "systemd"]
SEPARATE: Layout = "separate"
SYSTEMD: Layout = "systemd"
LAYOUTS: tuple[Layout, ...] = (SEPARATE, SYSTEMD)
# systemd's co-mounted v1 dirs and the controllers linked to them. On a host that mounts the controllers
# separately only the first one's hierarchy can take the co-mounted name (a hierarchy keeps the controller
# set it was first mounted with); it gets the link, the others stay separate mounts. A group none of whose
# controllers the host mounts is left out (this machine has no net_cls / net_prio hierarchy).
SYSTEMD_COMOUNTS: tuple[tuple[str, ...], ...] = (("cpu", "cpuacct"), ("net_cls", "net_prio"))


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy under /sys/fs/cgroup (v1 controllers, name=systemd, unified)."""
    out: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        mnt = Path(left.split()[4])
        if fstype in ("cgroup", "cgroup2") and mnt.parent == CGROUP_MNT and mnt not in out:
            out.append(mnt)
    return sorted(out)


def host_cgroup_listing() -> list[tuple[str, str]]:
    """The host's /sys/fs/cgroup tmpfs as (name, kind) pairs, kind `dir`, `link -> target` or `file`: the
    stacks compare it before and after, so a layout that wrote the host's tmpfs fails."""
    out: list[tuple[str, str]] = []
    for entry in os.scandir(CGROUP_MNT):
        if entry.is_symlink():
            kind = f"link -> {os.readlink(entry.path)}"
        else:
            kind = "dir" if entry.is_dir() else "file"
        out.append((entry.name, kind))
    return sorted(out)


KUBE_DIRS = ("kubepods", "kubepods/burstable", "kubepods/besteffort")


@dataclass
class CgroupTree:
    """`koordqos-e2e-<hex>` in every hierarchy, with the kubelet's QoS dirs; removed by `cleanup`."""

    name: str = field(default_factory=lambda: f"koordqos-e2e-{uuid.uuid4().hex[:10]}")
    hierarchies: list[Path] = field(default_factory=cgroup_hierarchies)
    layout: Layout = SEPARATE
    # systemd layout: where the wrapper builds the view's tmpfs before moving it over /sys/fs/cgroup (an
    # empty dir of the stack's temp dir; the mount is private to the namespace, the host sees it empty)
    view_dir: Path | None = None

    def view(self) -> tuple[dict[str, Path], dict[str, str]]:
        """The view's entries: name → the hierarchy bound there, and name → symlink target."""
        binds = {h.name: h for h in self.hierarchies}
        links: dict[str, str] = {}
        if self.layout == SYSTEMD:
            for group in SYSTEMD_COMOUNTS:
                joined = ",".join(group)
                if joined in binds or group[0] not in binds:
                    continue  # the host co-mounts them already, or has no such hierarchy
                binds[joined] = binds.pop(group[0])
                links[group[0]] = joined
        return binds, links

    def real(self, hierarchy: str, rel: str = "") -> Path:
        """The host's path of `rel` (a dir as the agent and runc see it, e.g. kubepods/besteffort)."""
        base = CGROUP_MNT / hierarchy / self.name
        return base / rel if rel else base

    def read(self, hierarchy: str, rel: str, name: str) -> str:
        """A cgroup file of the scratch tree, stripped."""
        return (self.real(hierarchy, rel) / name).read_text().strip()

    def _mkdir(self, d: Path) -> None:
        d.mkdir(exist_ok=True)
        if (
            d / "cpuset.cpus"
        ).exists():  # a new cpuset group is empty: copy the parent's, as the kubelet does
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((d.parent / f).read_text())

    def create(self) -> None:
        """Create the tree (the kubepods/{burstable,besteffort} dirs as a kubelet would)."""
        for h in self.hierarchies:
            self._mkdir(h / self.name)
            for rel in KUBE_DIRS:
                self._mkdir(h / self.name / rel)

    def wrap(self, argv: list[str], *, read_only_proc_sys: bool = False) -> list[str]:
        """`argv` run where the scratch tree is the whole cgroup hierarchy.

        The wrapper joins the tree's root cgroup in every hierarchy, then unshares a cgroup namespace
        (so /proc/<pid>/cgroup is relative to the tree, which runc needs to mount a container's
        /sys/fs/cgroup) and a mount namespace in which the tree is bind-mounted over each hierarchy
        (`separate`) or a new tmpfs in systemd's layout holds the tree's binds (`systemd`).
        """
        join = [f"echo $$ > {h / self.name}/cgroup.procs" for h in self.hierarchies]
        if self.layout == SEPARATE:
            binds = [f"mount --bind {h / self.name} {h}" for h in self.hierarchies]
        else:
            binds = self._systemd_view()
        if read_only_proc_sys:
            binds += ["mount --bind /proc/sys /proc/sys", "mount -o remount,bind,ro /proc/sys"]
        inner = "set -e; " + "; ".join(binds) + '; exec "$@"'
        unshare = ["unshare", "--cgroup", "--mount", "--propagation", "private", "--"]
        outer = "set -e; " + "; ".join(join) + '; exec "$@"'
        return ["/bin/sh", "-c", outer, "sh", *unshare, "/bin/sh", "-c", inner, "sh", *argv]

    def _systemd_view(self) -> list[str]:
        """Shell steps that put a new tmpfs with systemd's layout over /sys/fs/cgroup: built at `view_dir`
        (the hierarchies' scratch dirs are still reachable at their host paths there), then moved."""
        if self.view_dir is None:
            raise ValueError("the systemd layout needs CgroupTree.view_dir")
        v = self.view_dir
        binds, links = self.view()
        steps = [f"mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs {v}"]
        for name, h in sorted(binds.items()):
            steps += [f"mkdir '{v}/{name}'", f"mount --bind {h / self.name} '{v}/{name}'"]
        steps += [f"ln -s '{target}' '{v}/{name}'" for name, target in sorted(links.items())]
        # read-only once built, as systemd leaves it (the hierarchies below are mounts of their own)
        steps.append(f"mount -o remount,ro,nosuid,nodev,noexec,mode=755 tmpfs {v}")
        steps.append(f"mount --move {v} {CGROUP_MNT}")
        return steps

    def check_view(self, pid: int) -> None:
        """Raise unless process `pid` sees the layout: each name of `view()` is the scratch dir of its
        hierarchy (same device and inode, through the process's own root), each link reads as its target,
        nothing else is there, and in the systemd layout /sys/fs/cgroup is a tmpfs of its own."""
        root = Path(f"/proc/{pid}/root") / str(CGROUP_MNT).lstrip("/")
        binds, links = self.view()
        problems: list[str] = []

        def same(a: Path, b: Path) -> bool:
            try:
                sa, sb = a.stat(), b.stat()
            except OSError:
                return False
            return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)

        for name, h in sorted(binds.items()):
            if (root / name).is_symlink() or not same(root / name, h / self.name):
                problems.append(f"{name} is not {h / self.name}")
        for name, target in sorted(links.items()):
            if not (root / name).is_symlink() or os.readlink(root / name) != target:
                problems.append(f"{name} is not a link to {target}")
        extra = sorted(set(os.listdir(root)) - set(binds) - set(links))
        if extra:
            problems.append(f"unexpected entries {extra}")
        own_tmpfs = root.stat().st_dev != CGROUP_MNT.stat().st_dev
        if own_tmpfs != (self.layout == SYSTEMD):
            problems.append(f"{CGROUP_MNT} {'is not' if own_tmpfs else 'is'} the host's tmpfs")
        if problems:
            raise AssertionError(f"{self.layout} cgroup view of pid {pid}: " + "; ".join(problems))

    def procs(self) -> set[int]:
        """Every pid in any cgroup of the tree."""
        pids: set[int] = set()
        for h in self.hierarchies:
            for dirpath, _dirs, files in os.walk(h / self.name):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError, ValueError):
                        pids.update(int(p) for p in Path(dirpath, "cgroup.procs").read_text().split())
        return pids

    def cleanup(self) -> list[str]:
        """Kill what is left in the tree, remove every dir; returns problems (empty when clean)."""
        problems: list[str] = []
        deadline = time.monotonic() + 15
        while (pids := self.procs()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        if self.procs():
            problems.append(f"processes left in {self.name}: {sorted(self.procs())}")
        for h in self.hierarchies:
            try:
                scratchcg.remove_tree(h / self.name)
            except OSError as exc:
                problems.append(f"cannot remove {h / self.name}: {exc}")
        return problems
