"""SyntheticNode: a fake node directory (cgroup tree, /proc, /sys) for tests, benchmarks and demos.

It lays out what the kernel would show under `--cgroup-root`, `--proc-root` and `--sys-root`: cgroup v1 as
systemd mounts it on most nodes (by default: `cpu,cpuacct` and `net_cls,net_prio` co-mounted, with the links
`cpu`, `cpuacct`, `net_cls`, `net_prio` to them; `V1Mounts.SEPARATE` gives one dir per controller, as some
hosts mount them), hybrid (v1 and systemd's `unified` v2 mount) or v2 (unified), with systemd or cgroupfs
naming, pod and container dirs with the
files the agent reads and writes, and counters a test can advance (`add_cpu_usage`, `advance_node_cpu`,
`add_throttling`, `set_memory`).

Files that change while an agent may be reading them (`write`, the counters, /proc/stat and /proc/meminfo)
are rewritten in place like the kernel's: one write of the whole content at offset 0, then the file cut to
its length, never truncated first. A reader (the agent holds cgroup files open and re-reads them) sees the
old or the new content, never an empty file: a counter's text does not get shorter as it grows.
Truncating first left the file empty between the two syscalls, and a writer pre-empted there (a loaded
machine) had the agent read nothing: a missing sample, or a node of `os.cpu_count()` CPUs instead of the
synthetic node's.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.model.cpuset import format_cpuset
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS

GiB = 1 << 30
V1_SUBSYSTEMS = ("cpu", "cpuacct", "cpuset", "memory", "blkio")


class V1Mounts(enum.StrEnum):
    """How the v1 controllers are mounted: co-mounted pairs behind links (systemd), or one dir each."""

    SYSTEMD = "systemd"
    SEPARATE = "separate"


# systemd's co-mounted hierarchies and the links it makes to them
CO_MOUNTED = {"cpu,cpuacct": ("cpu", "cpuacct"), "net_cls,net_prio": ("net_cls", "net_prio")}
_LRU = ("inactive_anon", "active_anon", "inactive_file", "active_file", "unevictable")
# memory.stat as the kernel lays it out (the five LRU lists on consecutive lines; v1's totals last), all 0
V1_MEMORY_STAT = "".join(f"{k} 0\n" for k in ("cache", "rss", *_LRU)) + "".join(
    f"total_{k} 0\n" for k in ("cache", "rss", *_LRU)
)
V2_MEMORY_STAT = "".join(f"{k} 0\n" for k in ("anon", "file", *_LRU, "slab_reclaimable"))

# kernel-specific files, created only when asked for via `extensions`
EXTENSION_FILES = {
    "cpu.cfs_burst_us": ("cpu", "0"),
    "cpu.idle": ("cpu", "0"),
    "cpu.bvt_warp_ns": ("cpu", "0"),
    "memory.min": ("memory", "0"),
    "memory.low": ("memory", "0"),
    "memory.high": ("memory", "max"),
    "memory.wmark_ratio": ("memory", "0"),
    "memory.wmark_scale_factor": ("memory", "50"),
    "memory.wmark_min_adj": ("memory", "0"),
    "memory.priority": ("memory", "0"),
    "memory.use_priority_oom": ("memory", "0"),
    "memory.oom.group": ("memory", "0"),
    "memory.pagecache_limit.enable": ("memory", "0"),
    "memory.pagecache_limit.size": ("memory", "0"),
    "memory.pagecache_limit.sync": ("memory", "0"),
    "blkio.cost.weight": ("blkio", "default 100"),
}


def overwrite(path: Path, text: str) -> None:
    """Replace a file's content in place without an empty moment (see the module docstring)."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], done)
        os.ftruncate(fd, len(data))  # only a shorter content leaves a tail to cut
    finally:
        os.close(fd)


class SyntheticNode:
    """A synthetic node rooted at `base` (subdirs `cgroup`, `proc`, `sys`)."""

    def __init__(
        self,
        base: Path,
        version: CgroupVersion = CgroupVersion.V1,
        driver: CgroupDriver = CgroupDriver.CGROUPFS,
        *,
        cpus: int = 4,
        memory_total: int = 16 * GiB,
        extensions: Iterable[str] = (),
        v1_mounts: V1Mounts = V1Mounts.SYSTEMD,
        hybrid: bool = False,
    ) -> None:
        self.base = Path(base)
        self.version = version
        self.driver = driver
        self.v1_mounts = v1_mounts
        self.hybrid = hybrid and version is CgroupVersion.V1
        self.cpus = cpus
        self.extensions = frozenset(extensions)
        self.cgroup_root = self.base / "cgroup"
        self.proc_root = self.base / "proc"
        self.sys_root = self.base / "sys"
        self._busy = 0
        self._idle = 0
        self._cpu_busy: dict[int, int] = {}  # per-CPU busy ticks (the `cpuN` lines), see `advance_cpu`
        self.layout = CgroupLayout(
            self.cgroup_root,
            version,
            driver,
            hybrid=self.hybrid,
            proc_root=self.proc_root,
            sys_root=self.sys_root,
        )
        self._build(memory_total)
        self.layout.resolve_controllers()

    @property
    def hierarchies(self) -> tuple[str, ...]:
        """The real v1 hierarchy dirs under the cgroup root (links not included); ("",) on v2."""
        if self.version is CgroupVersion.V2:
            return ("",)
        if self.v1_mounts is V1Mounts.SEPARATE:
            return V1_SUBSYSTEMS
        return ("cpu,cpuacct", "cpuset", "memory", "blkio", "net_cls,net_prio")

    def describe(self) -> str:
        """The node's shape in a word or two: "v1-systemd", "v1-separate", "hybrid", "v2"."""
        if self.version is CgroupVersion.V2:
            return "v2"
        return "hybrid" if self.hybrid else f"v1-{self.v1_mounts}"

    # -- construction --------------------------------------------------------------------------------------

    def _build(self, memory_total: int) -> None:
        self.cgroup_root.mkdir(parents=True, exist_ok=True)
        if self.version is CgroupVersion.V2:
            (self.cgroup_root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
            (self.cgroup_root / "cpu.stat").write_text("usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
        else:
            for sub in self.hierarchies:
                (self.cgroup_root / sub).mkdir(exist_ok=True)
            if self.v1_mounts is V1Mounts.SYSTEMD:
                for target, links in CO_MOUNTED.items():
                    for link in links:
                        (self.cgroup_root / link).symlink_to(target)  # relative, as systemd makes them
            if self.hybrid:
                unified = self.cgroup_root / "unified"
                unified.mkdir(exist_ok=True)
                (unified / "cgroup.controllers").write_text("\n")  # systemd's v2 mount: no controllers
            self._files("", root=True)
        for rel in self.layout.qos_dirs():
            self.make_cgroup(rel)
        self.set_meminfo(memory_total, memory_total // 2, memory_total // 4)
        self.advance_node_cpu(0, 0)
        cpu_dir = self.sys_root / "devices/system/cpu"
        cpu_dir.mkdir(parents=True, exist_ok=True)
        (cpu_dir / "online").write_text(f"0-{self.cpus - 1}\n")
        for i in range(self.cpus):
            topo = cpu_dir / f"cpu{i}" / "topology"
            topo.mkdir(parents=True, exist_ok=True)
            (topo / "core_id").write_text(f"{i // 2}\n")  # two hyperthreads per core
            (topo / "physical_package_id").write_text("0\n")
            (cpu_dir / f"cpu{i}" / "node0").mkdir(exist_ok=True)

    def _dir(self, rel: str, subsystem: str) -> Path:
        base = self.cgroup_root / subsystem if self.version is CgroupVersion.V1 else self.cgroup_root
        return base / rel if rel else base

    def _files(self, rel: str, root: bool = False) -> None:
        all_cpus = format_cpuset(range(self.cpus))
        if self.version is CgroupVersion.V1:
            files: dict[tuple[str, str], str] = {
                ("cpu", "cpu.shares"): "1024",
                ("cpu", "cpu.cfs_quota_us"): "-1",
                ("cpu", "cpu.cfs_period_us"): "100000",
                ("cpu", "cpu.stat"): "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
                ("cpuacct", "cpuacct.usage"): "0",
                ("cpuset", "cpuset.cpus"): all_cpus,
                ("cpuset", "cpuset.mems"): "0",
                ("memory", "memory.limit_in_bytes"): "9223372036854771712",
                ("memory", "memory.usage_in_bytes"): "0",
                ("memory", "memory.stat"): V1_MEMORY_STAT,
                ("blkio", "blkio.throttle.read_bps_device"): "",
                ("blkio", "blkio.throttle.read_iops_device"): "",
                ("blkio", "blkio.throttle.write_bps_device"): "",
                ("blkio", "blkio.throttle.write_iops_device"): "",
                ("cpu", "tasks"): "",
            }
            if self._dir("", "net_cls").is_dir():  # systemd's net_cls,net_prio (not in V1Mounts.SEPARATE)
                files[("net_cls", "net_cls.classid")] = "0"
        else:
            files = {
                ("cpu", "cpu.weight"): "100",
                ("cpu", "cpu.max"): "max 100000",
                ("cpu", "cpu.max.burst"): "0",
                ("cpu", "cpu.stat"): (
                    "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"
                    "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
                ),
                ("cpuset", "cpuset.cpus"): "",
                ("cpuset", "cpuset.cpus.effective"): all_cpus,
                ("cpuset", "cpuset.mems"): "",
                ("memory", "memory.max"): "max",
                ("memory", "memory.current"): "0",
                ("memory", "memory.stat"): V2_MEMORY_STAT,
                ("memory", "memory.min"): "0",
                ("memory", "memory.low"): "0",
                ("memory", "memory.high"): "max",
                ("io", "io.max"): "",
                ("io", "io.weight"): "default 100",
                ("cpu", "cgroup.threads"): "",
            }
        for name in self.extensions:
            sub, default = EXTENSION_FILES[name]
            if self.version is CgroupVersion.V2:
                name = {"blkio.cost.weight": "io.weight"}.get(name, name)
            elif name.startswith("memory.pagecache_limit."):
                continue  # Anolis has the page-cache limit on v2 only
            files.setdefault((sub, name), default)
        for (sub, name), value in files.items():
            path = self._dir(rel, sub) / name
            if not path.exists():
                path.write_text(value + ("\n" if value and not value.endswith("\n") else ""))

    def root_flags(self) -> list[str]:
        """The agent's host-root flags for this node: --cgroup-root, --proc-root, --sys-root."""
        return [
            "--cgroup-root",
            str(self.cgroup_root),
            "--proc-root",
            str(self.proc_root),
            "--sys-root",
            str(self.sys_root),
        ]

    def make_cgroup(self, rel: str) -> None:
        """Create a cgroup dir (in every subsystem on v1) with default files."""
        for sub in self.hierarchies:
            self._dir(rel, sub).mkdir(parents=True, exist_ok=True)
        self._files(rel)

    def add_pod(self, pod: PodInfo) -> str:
        """Create the pod's dir and its started containers' dirs; returns the pod dir."""
        pod_dir = self.layout.pod_dir(pod)
        self.make_cgroup(pod_dir)
        for c in (*pod.containers, *pod.init_containers):
            if c.container_id:
                self.make_cgroup(self.layout.container_dir_in(pod_dir, c.container_id))
        return pod_dir

    def remove_cgroup(self, rel: str) -> None:
        """Remove a cgroup dir (and what is under it) in every subsystem."""
        import shutil

        for sub in self.hierarchies:
            shutil.rmtree(self._dir(rel, sub), ignore_errors=True)

    def pod_dir(self, uid: str, kube_qos: KubeQoS) -> str:
        """Relative dir of a pod."""
        return self.layout.pod_dir_for(uid, kube_qos)

    # -- files ---------------------------------------------------------------------------------------------

    def path(self, rel: str, subsystem: str, name: str) -> Path:
        """Absolute path of a file in a cgroup dir."""
        return self._dir(rel, subsystem) / name

    def read(self, rel: str, subsystem: str, name: str) -> str:
        """A cgroup file's content, stripped."""
        return self.path(rel, subsystem, name).read_text().strip()

    def write(self, rel: str, subsystem: str, name: str, value: str | int) -> None:
        """Overwrite a cgroup file (in place, never seen empty)."""
        overwrite(self.path(rel, subsystem, name), f"{value}\n")

    def _kv(self, path: Path) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            out[k] = int(v)
        return out

    def _write_kv(self, path: Path, kv: dict[str, int]) -> None:
        overwrite(path, "".join(f"{k} {v}\n" for k, v in kv.items()))

    # -- counters ------------------------------------------------------------------------------------------

    def cpu_usage_ns(self, rel: str) -> int:
        """The cgroup's cumulative CPU time in ns."""
        if self.version is CgroupVersion.V1:
            return int(self.read(rel, "cpuacct", "cpuacct.usage"))
        return self._kv(self.path(rel, "cpu", "cpu.stat"))["usage_usec"] * 1000

    def add_cpu_usage(self, rel: str, ns: int) -> None:
        """Advance the cgroup's cumulative CPU time by `ns` nanoseconds (µs granularity on v2)."""
        if self.version is CgroupVersion.V1:
            self.write(rel, "cpuacct", "cpuacct.usage", self.cpu_usage_ns(rel) + ns)
            return
        path = self.path(rel, "cpu", "cpu.stat")
        kv = self._kv(path)
        kv["usage_usec"] += ns // 1000
        self._write_kv(path, kv)

    def add_throttling(self, rel: str, periods: int, throttled: int) -> None:
        """Advance cpu.stat nr_periods / nr_throttled."""
        path = self.path(rel, "cpu", "cpu.stat")
        kv = self._kv(path)
        kv["nr_periods"] += periods
        kv["nr_throttled"] += throttled
        self._write_kv(path, kv)

    def set_memory(
        self, rel: str, usage: int, inactive_file: int = 0, anon: int | None = None, active_file: int = 0
    ) -> None:
        """Set the cgroup's memory usage and page counts (`anon`: active anonymous pages, if given)."""
        v1 = self.version is CgroupVersion.V1
        self.write(rel, "memory", "memory.usage_in_bytes" if v1 else "memory.current", usage)
        stat = self.path(rel, "memory", "memory.stat")
        kv = self._kv(stat)
        p = "total_" if v1 else ""
        kv[p + "inactive_file"] = inactive_file
        if anon is not None:
            kv[p + "active_anon"] = anon
            kv[p + "active_file"] = active_file
        self._write_kv(stat, kv)

    def advance_node_cpu(self, busy_ticks: int, idle_ticks: int) -> None:
        """Advance /proc/stat: `busy_ticks` spread over user/system, `idle_ticks` to idle (USER_HZ ticks)."""
        self._busy += busy_ticks
        self._idle += idle_ticks
        user = self._busy // 2
        system = self._busy - user
        lines = [f"cpu  {user} 0 {system} {self._idle} 0 0 0 0 0 0"]
        lines += [f"cpu{i} {self._cpu_busy.get(i, 0)} 0 0 0 0 0 0 0 0 0" for i in range(self.cpus)]
        lines += ["intr 0", "ctxt 0", "btime 0", "processes 1", "procs_running 1", "procs_blocked 0"]
        self.proc_root.mkdir(parents=True, exist_ok=True)
        overwrite(self.proc_root / "stat", "\n".join(lines) + "\n")

    def advance_cpu(self, cpu: int, busy_ticks: int) -> None:
        """Advance one CPU's busy ticks (its `cpuN` line of /proc/stat; the aggregate line too)."""
        self._cpu_busy[cpu] = self._cpu_busy.get(cpu, 0) + busy_ticks
        self.advance_node_cpu(busy_ticks, 0)

    def set_numa(self, node: int, cpus: Iterable[int], meminfo: Mapping[str, int]) -> None:
        """Make NUMA node `node` of `cpus` (their `cpuN/node<node>` links move to it) with a
        `devices/system/node/node<N>/meminfo` of `meminfo` (bytes, written in kB: MemTotal, MemFree, …)."""
        cpu_dir = self.sys_root / "devices/system/cpu"
        for cpu in cpus:
            for old in (cpu_dir / f"cpu{cpu}").glob("node*"):
                old.rmdir()
            (cpu_dir / f"cpu{cpu}" / f"node{node}").mkdir()
        node_dir = self.sys_root / f"devices/system/node/node{node}"
        node_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"Node {node} {k + ':':<16}{v // 1024:>10} kB\n" for k, v in meminfo.items())
        overwrite(node_dir / "meminfo", text)

    def set_meminfo(self, total: int, available: int, free: int) -> None:
        """Write /proc/meminfo (values in bytes, stored in kB like the kernel)."""
        self.proc_root.mkdir(parents=True, exist_ok=True)
        overwrite(
            self.proc_root / "meminfo",
            f"MemTotal:       {total // 1024} kB\nMemFree:        {free // 1024} kB\n"
            f"MemAvailable:   {available // 1024} kB\nBuffers:        0 kB\nCached:         0 kB\n",
        )

    def set_pressure(
        self, rel: str | None, resource: str, some_us: int, full_us: int | None = None, avg10: float = 0.0
    ) -> None:
        """A PSI file: the node's `<proc>/pressure/<resource>` (rel None) or a cgroup's `<resource>.pressure`
        (v2: in the hierarchy; hybrid: in `unified/`), cumulative stall totals in µs (averages `avg10`)."""
        avgs = f"avg10={avg10:.2f} avg60={avg10:.2f} avg300={avg10:.2f}"
        text = f"some {avgs} total={some_us}\n"
        if full_us is not None:
            text += f"full {avgs} total={full_us}\n"
        if rel is None:
            (self.proc_root / "pressure").mkdir(parents=True, exist_ok=True)
            overwrite(self.proc_root / "pressure" / resource, text)
        elif self.hybrid:
            d = self.cgroup_root / "unified" / rel
            d.mkdir(parents=True, exist_ok=True)
            overwrite(d / f"{resource}.pressure", text)
        else:
            overwrite(self.path(rel, "cpu", f"{resource}.pressure"), text)

    # -- more of the host: threads, resctrl, sysctls, block devices ----------------------------------------

    def set_threads(self, rel: str, tids: Iterable[int]) -> None:
        """The thread ids of a cgroup (`tasks` in the v1 cpu hierarchy, `cgroup.threads` on v2)."""
        name = "tasks" if self.version is CgroupVersion.V1 else "cgroup.threads"
        self.path(rel, "cpu", name).write_text("".join(f"{t}\n" for t in tids))

    @property
    def resctrl_root(self) -> Path:
        """Where resctrl is mounted under the sys root."""
        return self.sys_root / "fs" / "resctrl"

    def add_resctrl(
        self,
        cbm: str = "7ff",
        cache_ids: Iterable[int] = (0, 1),
        vendor: str = "GenuineIntel",
        mba: bool = True,
    ) -> None:
        """A mounted resctrl with L3 CAT (and MBA): root schemata, info/L3/cbm_mask, tasks; vendor."""
        ids = list(cache_ids)
        root = self.resctrl_root
        (root / "info" / "L3").mkdir(parents=True, exist_ok=True)
        (root / "info" / "L3" / "cbm_mask").write_text(cbm + "\n")
        lines = ["L3:" + ";".join(f"{i}={cbm}" for i in ids)]
        if mba:
            (root / "info" / "MB").mkdir(parents=True, exist_ok=True)
            full = "2048" if vendor == "AuthenticAMD" else "100"
            lines.append("MB:" + ";".join(f"{i}={full}" for i in ids))
        (root / "schemata").write_text("\n".join(lines) + "\n")
        (root / "tasks").write_text("1\n")
        self.proc_root.mkdir(parents=True, exist_ok=True)
        flags = "fpu cat_l3 mba rdt_a" if vendor != "AuthenticAMD" else "fpu cat_l3 mba"
        (self.proc_root / "cpuinfo").write_text(
            "".join(
                f"processor\t: {i}\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n\n" for i in range(self.cpus)
            )
        )

    def add_sysctls(self, **extra: str) -> None:
        """The vm sysctls (and, by keyword, optional files: "memcg_reaper", "group_identity", "idle_saver",
        "pagecache_limit", "sched_features"=content) with the spec's initial values."""
        vm = self.proc_root / "sys" / "vm"
        vm.mkdir(parents=True, exist_ok=True)
        (vm / "min_free_kbytes").write_text("5368709\n")
        (vm / "watermark_scale_factor").write_text("150\n")
        kernel = self.proc_root / "sys" / "kernel"
        kernel.mkdir(parents=True, exist_ok=True)
        files = {
            "memcg_reaper": self.sys_root / "kernel/mm/memcg_reaper/reap_background",
            "group_identity": kernel / "sched_group_identity_enabled",
            "idle_saver": kernel / "sched_idle_saver_wmark",
            "pagecache_limit": self.sys_root / "kernel/mm/pagecache_limit/enabled",
            "sched_features": self.sys_root / "kernel/debug/sched_features",
        }
        for key, value in extra.items():
            path = files[key]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value if value.endswith("\n") or not value else value + "\n")

    def add_block_device(self, name: str, number: str, partitions: Iterable[tuple[str, str]] = ()) -> None:
        """A disk under <sys>/block with its MAJ:MIN and partitions."""
        d = self.sys_root / "block" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "dev").write_text(number + "\n")
        for part, pnum in partitions:
            (d / part).mkdir(exist_ok=True)
            (d / part / "dev").write_text(pnum + "\n")

    def add_logical_volume(self, dm: str, number: str, vg: str, lv: str, pv: str) -> str:
        """A device-mapper LV `<vg>-<lv>` on physical volume `pv` (disk or partition); its /dev path."""
        d = self.sys_root / "block" / dm
        (d / "dm").mkdir(parents=True, exist_ok=True)
        (d / "slaves" / pv).mkdir(parents=True, exist_ok=True)
        (d / "dev").write_text(number + "\n")
        name = f"{vg.replace('-', '--')}-{lv.replace('-', '--')}"
        (d / "dm" / "name").write_text(name + "\n")
        return f"/dev/mapper/{name}"

    def add_mount(self, device: str, point: str) -> None:
        """A line of <proc>/mounts."""
        self.proc_root.mkdir(parents=True, exist_ok=True)
        mounts = self.proc_root / "mounts"
        old = mounts.read_text() if mounts.exists() else ""
        mounts.write_text(old + f"{device} {point} ext4 rw,relatime 0 0\n")

    def add_blkio_root(self) -> None:
        """The root-only io cost files (v1 Anolis `blkio.cost.qos`/`.model`; v2 `io.cost.qos`/`.model`)."""
        if self.version is CgroupVersion.V1:
            base, names = self.cgroup_root / "blkio", ("blkio.cost.qos", "blkio.cost.model")
        else:
            base, names = self.cgroup_root, ("io.cost.qos", "io.cost.model")
        for n in names:
            (base / n).write_text("")
