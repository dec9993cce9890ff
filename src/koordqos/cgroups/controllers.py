"""Where each cgroup v1 controller's hierarchy is under the cgroup root.

On systemd's v1 layout (Ubuntu 20.04, CentOS 7/8, Anolis 8, Debian 10) controllers are co-mounted and
`<root>/cpu` is a link: `cpu -> cpu,cpuacct`, `cpuacct -> cpu,cpuacct`, `net_cls -> net_cls,net_prio`,
`net_prio -> net_cls,net_prio`. Every cgroup file is opened beneath the root without following a symlink
(`koordqos.fs`), so such a link has to be resolved to the directory it names before any path is built, once
at start (and again when a link changes), and checked there:

* the link leads to a directory inside the root (a link out of the root is a start-up error, exit 2);
* on a real root the directory is a cgroup v1 mount that has that controller (mountinfo's super options);
  on a synthetic root (not a cgroup file system) a directory inside the root is enough.

Paths are then `<resolved dir>/<cgroup dir>/<file>`, opened one component at a time from the root with no
symlink followed: the controller links are followed once, here, never again below a controller's directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.errors import ConfigError, UnsafePathError
from koordqos.fs import open_beneath

#: The v1 controllers the agent reads or writes (net_cls/net_prio: systemd's other co-mounted pair).
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "blkio", "net_cls", "net_prio")
MOUNTINFO = "/proc/self/mountinfo"
CGROUP_FS_TYPES = frozenset({"cgroup", "cgroup2"})
_DIR_PATH = os.O_DIRECTORY | getattr(os, "O_PATH", os.O_RDONLY)


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of mountinfo: where, which file system, its super options (a v1 hierarchy's controllers)."""

    point: str
    fstype: str
    super_options: frozenset[str]


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo text (malformed lines skipped)."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        rest = right.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        point = fields[4].replace("\\040", " ").replace("\\134", "\\")
        out.append(Mount(point, rest[0], frozenset(rest[2].split(","))))
    return out


def read_mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """This process's mounts ([] when mountinfo cannot be read)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return []


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding `path` (resolved): the one with the longest mount point that contains it."""
    real = os.path.realpath(path)
    best: Mount | None = None
    for m in mounts:
        inside = real == m.point or real.startswith(m.point.rstrip("/") + "/")
        if inside and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


@dataclass(frozen=True, slots=True)
class ControllerDirs:
    """Each controller's directory relative to the cgroup root, and what could not be used.

    `dirs`: controller → its directory ("cpu" → "cpu,cpuacct" behind systemd's link, "memory" → "memory");
    a controller without an entry has no directory there (or a refused one: `problems` says why).
    `links`: controller → the link text, for the controllers reached through a link (what `changed` compares).
    """

    dirs: Mapping[str, str] = field(default_factory=dict)
    links: Mapping[str, str] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)

    def dir_of(self, controller: str) -> str:
        """The controller's directory relative to the root; its own name when unresolved (then every open
        through it is refused if it is a link, and fails if it is missing)."""
        return self.dirs.get(controller, controller)

    def describe(self) -> dict[str, str]:
        """The links as /debug/state and the start-up log show them: {"cpu": "cpu,cpuacct", ...}."""
        return {c: self.dirs.get(c, f"refused: {self.problems.get(c, '')}") for c in self.links}


def resolve_controllers(
    root: Path | str, *, names: tuple[str, ...] = V1_CONTROLLERS, mountinfo: str = MOUNTINFO
) -> ControllerDirs:
    """Resolve the v1 controller directories under `root` (see the module docstring); never raises."""
    root_s = str(root)
    real_root = os.path.realpath(root_s)
    mounts: list[Mount] | None = None
    dirs: dict[str, str] = {}
    links: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name in names:
        path = os.path.join(root_s, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue  # no such controller here
        if stat.S_ISLNK(st.st_mode):
            try:
                links[name] = os.readlink(path)
            except OSError as exc:
                problems[name] = f"{path}: unreadable link ({exc.strerror})"
                continue
            rel = os.path.relpath(os.path.realpath(path), real_root)
            if rel in {".", ".."} or rel.startswith("../") or os.path.isabs(rel):
                problems[name] = f"{path} -> {links[name]} leads outside the cgroup root {root_s}"
                continue
        elif stat.S_ISDIR(st.st_mode):
            rel = name
        else:
            problems[name] = f"{path} is neither a directory nor a link to one"
            continue
        try:  # the resolved dir must be reachable from the root with no further link
            os.close(open_beneath(root_s, rel, _DIR_PATH))
        except UnsafePathError:
            problems[name] = f"{path} resolves to {rel!r}, which passes through another link"
            continue
        except OSError as exc:
            if name in links:
                problems[name] = f"{path} -> {links[name]}: {exc.strerror}"
            continue
        if mounts is None:
            mounts = read_mounts(mountinfo)
        wrong = _not_a_mount_of(name, os.path.join(real_root, rel), mounts)
        if wrong:
            problems[name] = f"{path}{' -> ' + links[name] if name in links else ''}: {wrong}"
            continue
        dirs[name] = rel
    return ControllerDirs(dirs, links, problems)


def _not_a_mount_of(controller: str, real_dir: str, mounts: list[Mount]) -> str:
    """Why `real_dir` is not `controller`'s hierarchy ("" when it is, or when it is no cgroup mount at all:
    a synthetic root, where a directory inside the root is all there is to check)."""
    m = mount_of(real_dir, mounts)
    if m is None or m.fstype not in CGROUP_FS_TYPES:
        return ""
    if m.fstype == "cgroup2":
        return f"a cgroup v2 mount ({m.point}), not a v1 hierarchy of {controller}"
    if controller not in m.super_options:
        have = ",".join(sorted(o for o in m.super_options if o not in ("rw", "ro")))
        return f"a cgroup mount of {have or 'no controller'} ({m.point}), not of {controller}"
    return ""


def check_controllers(root: Path | str, dirs: ControllerDirs) -> None:
    """ConfigError (one line, exit 2 at start) naming the first controller link or dir that cannot be used."""
    for name, why in dirs.problems.items():
        raise ConfigError(f"--cgroup-root {root}: cgroup controller {name}: {why}")
