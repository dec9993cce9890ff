"""CgroupLayout: where the node's cgroups are (v1/v2/hybrid, systemd/cgroupfs) and how dirs are named.

Directories are handled as paths *relative* to the hierarchy ("kubepods/besteffort/pod<uid>"); `file_path`
turns (relative dir, resource) into an absolute file path: `<root>/<subsystem>/<dir>/<file>` on v1,
`<root>/<dir>/<file>` on v2. Names are checked as strings (relative dirs with `..`, absolute parts or NUL
bytes raise `PathEscapeError`, counted), but a path string is never the confinement: a checked name can
still be a symlink on disk, and a directory can be swapped for one at any time. Files are opened beneath the
root one component at a time without following symlinks (`koordqos.fs.open_beneath`; `file_rel` /
`subsystem_rel` give the path relative to the root for that), at every open. `check_dir` is an early,
uncached, advisory look for a symlinked component (a clear error for a planner); nothing relies on it.

On v1 each controller's directory is resolved once (`koordqos.cgroups.controllers`: systemd's
`cpu -> cpu,cpuacct` links), at start by `resolve_controllers` (a link out of the root is a start-up error)
and again by `refresh_controllers` when a link changes; paths start at the resolved directory, so no
symlink is ever followed when a file is opened.
"""

from __future__ import annotations

import asyncio
import ctypes
import enum
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.controllers import ControllerDirs, check_controllers
from koordqos.cgroups.controllers import resolve_controllers as _resolve
from koordqos.cgroups.resources import CgroupVersion, Resource, get_resource
from koordqos.errors import CgroupError, PathEscapeError, UnsafePathError
from koordqos.fs import open_beneath, subdirs_beneath
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS

log = structlog.get_logger("koordqos.cgroups")

PATH_REFUSED = Counter(
    "koordqos_cgroup_path_refused_total",
    "Cgroup paths refused because they would resolve outside the cgroup root",
    ["reason"],
    registry=obs.REGISTRY,
)


class CgroupDriver(enum.StrEnum):
    """The kubelet cgroup driver, which decides directory naming."""

    SYSTEMD = "systemd"
    CGROUPFS = "cgroupfs"


class ResourceUnsupported(CgroupError):
    """The resource has no file on this node (other cgroup version, or a kernel without it)."""


RUNTIME_SCOPE_PREFIX = {
    "containerd": "cri-containerd",
    "cri-o": "crio",
    "docker": "docker",
    "pouch": "pouch",
}
# how often the agent looks again at the controller links (a few syscalls and one mountinfo read)
CONTROLLER_CHECK_SECONDS = 10.0
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
_UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A container id split into its runtime and its bare id."""

    runtime: str
    id: str


def parse_container_id(text: str) -> ContainerRef:
    """Parse `<runtime>://<id>` (containerd, cri-o, docker, pouch); CgroupError/PathEscapeError if not."""
    runtime, sep, cid = text.partition("://")
    if not sep:
        raise CgroupError(f"container id {text!r} has no '<runtime>://' prefix")
    if runtime not in RUNTIME_SCOPE_PREFIX:
        raise CgroupError(f"container id {text!r}: unknown runtime {runtime!r}")
    if not _ID_RE.match(cid) or ".." in cid:
        PATH_REFUSED.labels("container-id").inc()
        raise PathEscapeError(f"container id {text!r} is not a plain identifier")
    return ContainerRef(runtime, cid)


def _check_uid(uid: str) -> str:
    if not _UID_RE.match(uid):
        PATH_REFUSED.labels("pod-uid").inc()
        raise PathEscapeError(f"pod uid {uid!r} is not a plain identifier")
    return uid


def check_relative(rel: str) -> str:
    """Normalise a relative cgroup dir ("a//b/" → "a/b"); PathEscapeError for `..`, absolute parts, NUL."""
    if "\x00" in rel:
        PATH_REFUSED.labels("nul").inc()
        raise PathEscapeError(f"cgroup dir {rel!r} contains a NUL byte")
    if rel.startswith("/"):
        PATH_REFUSED.labels("absolute").inc()
        raise PathEscapeError(f"cgroup dir {rel!r} is absolute; expected a dir relative to the cgroup root")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        PATH_REFUSED.labels("dotdot").inc()
        raise PathEscapeError(f"cgroup dir {rel!r} contains '..'")
    return "/".join(parts)


def kube_qos_of_parent(rel: str) -> KubeQoS:
    """Kube QoS class of a cgroup dir by name (besteffort, else burstable, else Guaranteed)."""
    if "besteffort" in rel:
        return KubeQoS.BESTEFFORT
    if "burstable" in rel:
        return KubeQoS.BURSTABLE
    return KubeQoS.GUARANTEED


class CgroupLayout:
    """The node's cgroup hierarchy: version, driver, directory naming, file paths, capabilities."""

    def __init__(
        self,
        root: Path | str,
        version: CgroupVersion = CgroupVersion.V1,
        driver: CgroupDriver = CgroupDriver.CGROUPFS,
        *,
        hybrid: bool = False,
        proc_root: Path | str = "/proc",
        sys_root: Path | str = "/sys",
        crio_cgroupfs_bare_ids: bool = False,
    ) -> None:
        self.root = Path(root)
        self.crio_cgroupfs_bare_ids = crio_cgroupfs_bare_ids
        self.version = version
        self.driver = driver
        self.hybrid = hybrid
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        self._caps: dict[str, bool] = {}
        self._core_sched: tuple[bool, str] | None = None
        self._controllers: ControllerDirs | None = (
            None  # v1: resolved on first use, or by resolve_controllers
        )
        self._on_change: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        hybrid = " hybrid" if self.hybrid else ""
        return f"CgroupLayout({str(self.root)!r}, {self.version}{hybrid}, {self.driver})"

    # -- detection --------------------------------------------------------------------------------

    @classmethod
    def detect(
        cls,
        root: Path | str,
        *,
        version: CgroupVersion | None = None,
        driver: CgroupDriver | None = None,
        proc_root: Path | str = "/proc",
        sys_root: Path | str = "/sys",
        crio_cgroupfs_bare_ids: bool = False,
    ) -> CgroupLayout:
        """Detect version (v2 if `cgroup.controllers` at the root; hybrid = v1 + `unified/`) and driver.

        The driver is systemd when `kubepods.slice` exists, cgroupfs when `kubepods` does; an empty root
        defaults to v1 + cgroupfs. Explicit `version`/`driver` win over detection.
        """
        r = Path(root)
        hybrid = False
        if version is None:
            if (r / "cgroup.controllers").exists():
                version = CgroupVersion.V2
            else:
                version = CgroupVersion.V1
                hybrid = (r / "unified" / "cgroup.controllers").exists()
        if driver is None:
            base = r if version is CgroupVersion.V2 else r / "cpu"
            driver = CgroupDriver.SYSTEMD if (base / "kubepods.slice").is_dir() else CgroupDriver.CGROUPFS
        layout = cls(
            r,
            version,
            driver,
            hybrid=hybrid,
            proc_root=proc_root,
            sys_root=sys_root,
            crio_cgroupfs_bare_ids=crio_cgroupfs_bare_ids,
        )
        log.info("cgroup layout", root=str(r), version=str(version), driver=str(driver), hybrid=hybrid)
        return layout

    # -- controller directories -------------------------------------------------------------------

    @property
    def controllers(self) -> ControllerDirs:
        """Each v1 controller's directory relative to the root (empty on v2: one hierarchy at the root).

        Resolved on first use when `resolve_controllers` was not called (tests, tools); a refused link is
        then logged and left unresolved, so every open through it is refused."""
        dirs = self._controllers
        if dirs is None:
            dirs = self._controllers = self._resolve()
            for name, why in dirs.problems.items():
                log.warning("cgroup controller directory refused", controller=name, reason=why)
        return dirs

    def _resolve(self) -> ControllerDirs:
        if self.version is CgroupVersion.V2:
            return ControllerDirs()
        return _resolve(self.root)

    def resolve_controllers(self) -> ControllerDirs:
        """Resolve the controller directories now (at start): ConfigError naming a controller link that
        leads outside the root, or a directory that is not a cgroup mount of its controller."""
        dirs = self._resolve()
        check_controllers(self.root, dirs)
        self._controllers = dirs
        return dirs

    def refresh_controllers(self) -> bool:
        """Resolve the controller directories again; True (and every listener told) when one changed.

        A link that now leads somewhere refused keeps its old directory (a real directory beneath the root,
        still opened without following links), logged once per change."""
        old = self.controllers
        new = self._resolve()
        if new.links == old.links and new.dirs == old.dirs:
            return False
        dirs = dict(new.dirs)
        for name, why in new.problems.items():
            log.error(
                "cgroup controller link changed to a refused target; keeping the old directory",
                controller=name,
                reason=why,
                kept=old.dirs.get(name),
            )
            if name in old.dirs:
                dirs[name] = old.dirs[name]
        self._controllers = ControllerDirs(dirs, new.links, new.problems)
        if self._controllers.dirs == old.dirs:
            return False
        log.info("cgroup controller directories changed", old=dict(old.dirs), new=dirs)
        self.refresh_capabilities()
        for listener in self._on_change:
            listener()
        return True

    async def watch_controllers(self, interval: float = CONTROLLER_CHECK_SECONDS) -> None:
        """Re-resolve the controller directories every `interval` seconds (a component: until cancelled)."""
        while True:
            await asyncio.sleep(interval)
            self.refresh_controllers()

    def on_controllers_changed(self, listener: Callable[[], None]) -> None:
        """Call `listener` after `refresh_controllers` changed a directory (caches of paths drop them)."""
        self._on_change.append(listener)

    # -- directory naming -------------------------------------------------------------------------

    def kubepods_dir(self) -> str:
        """Relative dir of the kubepods root (parent of every pod cgroup; the Guaranteed QoS dir)."""
        return "kubepods.slice" if self.driver is CgroupDriver.SYSTEMD else "kubepods"

    def qos_dir(self, kube_qos: KubeQoS) -> str:
        """Relative dir of a Kubernetes QoS class (Guaranteed is the kubepods root itself)."""
        if kube_qos is KubeQoS.GUARANTEED:
            return self.kubepods_dir()
        name = "burstable" if kube_qos is KubeQoS.BURSTABLE else "besteffort"
        if self.driver is CgroupDriver.SYSTEMD:
            return f"kubepods.slice/kubepods-{name}.slice"
        return f"kubepods/{name}"

    def qos_dirs(self) -> tuple[str, str, str]:
        """Relative dirs of Guaranteed, Burstable and BestEffort, in that order."""
        return (
            self.qos_dir(KubeQoS.GUARANTEED),
            self.qos_dir(KubeQoS.BURSTABLE),
            self.qos_dir(KubeQoS.BESTEFFORT),
        )

    def pod_dir_for(self, uid: str, kube_qos: KubeQoS) -> str:
        """Relative dir of a pod by uid and Kubernetes QoS class (PathEscapeError for a hostile uid)."""
        _check_uid(uid)
        parent = self.qos_dir(kube_qos)
        if self.driver is CgroupDriver.SYSTEMD:
            prefix = {
                KubeQoS.GUARANTEED: "kubepods",
                KubeQoS.BURSTABLE: "kubepods-burstable",
                KubeQoS.BESTEFFORT: "kubepods-besteffort",
            }[kube_qos]
            return f"{parent}/{prefix}-pod{uid.replace('-', '_')}.slice"
        return f"{parent}/pod{uid}"

    def pod_dir(self, pod: PodInfo) -> str:
        """Relative dir of `pod` (from its uid and Kubernetes QoS class)."""
        return self.pod_dir_for(pod.uid, pod.kube_qos)

    def container_dir_in(self, pod_dir: str, container_id: str) -> str:
        """Relative dir of a container (`<runtime>://<id>`) inside a pod dir.

        systemd: `<prefix>-<id>.scope` for every runtime. cgroupfs: containerd and docker use the bare id,
        CRI-O names its dir `crio-<id>` (koordlet assumes `<id>`, so `crio_cgroupfs_bare_ids` keeps that).
        """
        ref = parse_container_id(container_id)
        pod_dir = check_relative(pod_dir)
        if self.driver is CgroupDriver.SYSTEMD:
            return f"{pod_dir}/{RUNTIME_SCOPE_PREFIX[ref.runtime]}-{ref.id}.scope"
        if ref.runtime == "cri-o" and not self.crio_cgroupfs_bare_ids:
            return f"{pod_dir}/crio-{ref.id}"
        return f"{pod_dir}/{ref.id}"

    def container_dir(self, pod: PodInfo, container_id: str) -> str:
        """Relative dir of one of `pod`'s containers (`<runtime>://<id>`)."""
        return self.container_dir_in(self.pod_dir(pod), container_id)

    def normalize_parent(self, parent: str) -> str:
        """A cgroup parent as runtimes report it (NRI/CRI) → a checked relative dir.

        Accepts cgroupfs paths ("/kubepods/besteffort/pod<uid>"), systemd slice names
        ("kubepods-besteffort-pod<uid>.slice", expanded to the slice hierarchy) and systemd
        "slice:prefix:id" container paths.
        """
        text = parent.strip()
        if ":" in text and self.driver is CgroupDriver.SYSTEMD:
            slice_name, prefix, cid = ([*text.split(":"), "", ""])[:3]
            if not _ID_RE.match(cid) or not _ID_RE.match(prefix):
                PATH_REFUSED.labels("container-id").inc()
                raise PathEscapeError(f"cgroup path {parent!r} has a malformed systemd scope")
            return f"{self._expand_slice(slice_name)}/{prefix}-{cid}.scope"
        if text.endswith(".slice") and "/" not in text.strip("/"):
            return self._expand_slice(text.strip("/"))
        # runtimes report cgroupfs parents from the hierarchy root ("/kubepods/..."): that leading "/" is
        # the cgroup root, not the host's; `..` is still refused
        return check_relative(text.lstrip("/"))

    def _expand_slice(self, name: str) -> str:
        check_relative(name)
        if not name.endswith(".slice") or "/" in name:
            PATH_REFUSED.labels("slice").inc()
            raise PathEscapeError(f"{name!r} is not a systemd slice name")
        stem = name[: -len(".slice")]
        parts = stem.split("-")
        # systemd nests a-b-c.slice as a.slice/a-b.slice/a-b-c.slice
        return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))

    # -- paths ------------------------------------------------------------------------------------

    def subsystem_rel(self, rel: str, subsystem: str) -> str:
        """`rel` in `subsystem`, relative to the root (v1: `<subsystem>/<rel>`, v2: `<rel>`; "": the root)."""
        rel = check_relative(rel)
        if self.version is CgroupVersion.V1:
            controllers = self._controllers or self.controllers
            base = controllers.dir_of(subsystem)
            return f"{base}/{rel}" if rel else base
        return rel

    def subsystem_dir(self, rel: str, subsystem: str) -> Path:
        """Absolute dir for `rel` in `subsystem` (v1: `<root>/<subsystem>/<rel>`; v2: `<root>/<rel>`).

        A path string only (names checked, nothing resolved): open what is under it with
        `koordqos.fs.open_beneath(layout.root, ...)`, never by this string.
        """
        sub = self.subsystem_rel(rel, subsystem)
        return self.root / sub if sub else self.root

    def check_dir(self, rel: str, subsystem: str) -> None:
        """Advisory: PathEscapeError (counted) when a component of `rel` in `subsystem` is a symlink now.

        Not cached and not the confinement (the dir can be swapped right after): it gives planners a clear
        early refusal; every open is confined by itself. A missing dir is no escape and passes.
        """
        sub = self.subsystem_rel(rel, subsystem)
        if not sub:
            return
        try:
            os.close(open_beneath(self.root, sub, os.O_DIRECTORY | getattr(os, "O_PATH", os.O_RDONLY)))
        except UnsafePathError as exc:
            PATH_REFUSED.labels("symlink").inc()
            raise PathEscapeError(
                f"cgroup dir {rel!r} in {subsystem}: {exc}; a symlink could lead outside {str(self.root)!r}"
            ) from None
        except OSError:
            return

    def list_subdirs(self, rel: str, subsystem: str) -> list[str]:
        """Sorted names of the real sub-dirs of `rel` in `subsystem`, listed beneath the root
        (`fs.subdirs_beneath`); [] when it is missing, unreadable or reached through a symlink."""
        try:
            return subdirs_beneath(self.root, self.subsystem_rel(rel, subsystem))
        except (OSError, CgroupError, UnsafePathError):
            return []

    def file_name(self, resource: Resource | str) -> str:
        """The file of `resource` on this hierarchy (ResourceUnsupported if it has none)."""
        res = get_resource(resource) if isinstance(resource, str) else resource
        name = res.file(self.version)
        if name is None:
            raise ResourceUnsupported(f"{res.name} does not exist on cgroup {self.version}")
        return name

    def file_path(self, rel: str, resource: Resource | str) -> Path:
        """Absolute path of `resource`'s file in relative dir `rel` (a string: open it with `file_rel`)."""
        return self.root / self.file_rel(rel, resource)

    def file_rel(self, rel: str, resource: Resource | str) -> str:
        """`resource`'s file in relative dir `rel`, relative to the root (for `fs.open_beneath`)."""
        res = get_resource(resource) if isinstance(resource, str) else resource
        name = self.file_name(res)
        sub = self.subsystem_rel(rel, res.subsystem)
        return f"{sub}/{name}" if sub else name

    # -- capabilities -----------------------------------------------------------------------------

    def supports(self, resource: Resource | str) -> bool:
        """Whether the node has `resource` (checked once, in the kubepods dir if present; then cached)."""
        res = get_resource(resource) if isinstance(resource, str) else resource
        cached = self._caps.get(res.name)
        if cached is not None:
            return cached
        ok, why = self._probe(res)
        self._caps[res.name] = ok
        if not ok:
            log.info(
                "cgroup resource unsupported on this node",
                resource=res.name,
                reason=why,
                version=str(self.version),
            )
        return ok

    def _probe(self, res: Resource) -> tuple[bool, str]:
        name = res.file(self.version)
        if name is None:
            return False, f"no {self.version} file"
        base = self.subsystem_dir("", res.subsystem)
        if not base.is_dir():
            return False, f"{base} missing"
        kubepods = base / self.kubepods_dir()
        probe = kubepods if kubepods.is_dir() and not res.root_only else base
        if (probe / name).exists():
            return True, "file exists"
        if res.standard and probe == base:
            # root cgroups lack some per-group files (v2 cpu.max); the controller being present is enough
            if self.version is CgroupVersion.V1:
                return True, "controller mounted"
            try:
                controllers = (base / "cgroup.controllers").read_text().split()
            except OSError:
                return False, "cgroup.controllers unreadable"
            if res.subsystem in controllers:
                return True, "controller enabled"
            return False, f"controller {res.subsystem} not enabled"
        return False, f"{probe / name} missing"

    def refresh_capabilities(self) -> None:
        """Forget cached capability results (e.g. once kubepods has been created)."""
        self._caps.clear()
        self._core_sched = None

    def group_identity_supported(self) -> bool:
        """Group identity: bvt file in the Guaranteed QoS dir, or sysctl sched_group_identity_enabled."""
        if self.supports("cpu.bvt_warp_ns"):
            return True
        return (self.proc_root / "sys/kernel/sched_group_identity_enabled").exists()

    def core_sched_supported(self) -> tuple[bool, str]:
        """Core scheduling support and why (sysctl, sched_features, or a prctl probe on the real host)."""
        if self._core_sched is None:
            self._core_sched = self._probe_core_sched()
        return self._core_sched

    def _probe_core_sched(self) -> tuple[bool, str]:
        if (self.proc_root / "sys/kernel/sched_core").exists():
            return True, "sysctl supported"
        feats = self.sys_root / "kernel/debug/sched_features"
        try:
            text = feats.read_text()
        except OSError:
            text = None
        if text is not None and ("CORE_SCHED" in text):
            return True, "sched_features supported"
        if str(self.proc_root) == "/proc":
            return _prctl_core_sched_probe()
        return False, "not supported neither by sysctl nor by sched_features"


def _prctl_core_sched_probe() -> tuple[bool, str]:
    """Ask the kernel for this process's core-sched cookie (PR_SCHED_CORE_GET); EINVAL means no support."""
    pr_sched_core, get, pidtype_pid = 62, 0, 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        cookie = ctypes.c_ulong(0)
        rc = libc.prctl(pr_sched_core, get, 0, pidtype_pid, ctypes.byref(cookie))
    except (OSError, AttributeError):
        return False, "prctl unavailable"
    if rc == 0:
        return True, "prctl supported"
    return False, f"not supported by prctl (errno {ctypes.get_errno()})"
