"""The scratch cgroup tree and the private view in which it is the whole cgroup hierarchy.

A uniquely named `koordqos-e2e-<hex>` dir in every hierarchy; containerd (with its shims and runc) and the
agent start through `CgroupTree.wrap`, which joins that dir, unshares a cgroup and a mount namespace and
bind-mounts the dir over `/sys/fs/cgroup/<hierarchy>`. Pods use the ordinary cgroupfs parent
`/kubepods/besteffort/pod<uid>`, the agent runs with `--cgroup-root /sys/fs/cgroup`, both agree on every dir
as on a real node, and neither can reach a cgroup outside the scratch tree. The tests read the same kernel
files from the host's side (`/sys/fs/cgroup/<hierarchy>/koordqos-e2e-<hex>/...`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.testing import scratchcg

CGROUP_MNT = Path("/sys/fs/cgroup")


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


KUBE_DIRS = ("kubepods", "kubepods/burstable", "kubepods/besteffort")


@dataclass
class CgroupTree:
    """`koordqos-e2e-<hex>` in every hierarchy, with the kubelet's QoS dirs; removed by `cleanup`."""

    name: str = field(default_factory=lambda: f"koordqos-e2e-{uuid.uuid4().hex[:10]}")
    hierarchies: list[Path] = field(default_factory=cgroup_hierarchies)

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
        /sys/fs/cgroup) and a mount namespace in which the tree is bind-mounted over each hierarchy.
        """
        join = [f"echo $$ > {h / self.name}/cgroup.procs" for h in self.hierarchies]
        binds = [f"mount --bind {h / self.name} {h}" for h in self.hierarchies]
        if read_only_proc_sys:
            binds += ["mount --bind /proc/sys /proc/sys", "mount -o remount,bind,ro /proc/sys"]
        inner = "set -e; " + "; ".join(binds) + '; exec "$@"'
        unshare = ["unshare", "--cgroup", "--mount", "--propagation", "private", "--"]
        outer = "set -e; " + "; ".join(join) + '; exec "$@"'
        return ["/bin/sh", "-c", outer, "sh", *unshare, "/bin/sh", "-c", inner, "sh", *argv]

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
