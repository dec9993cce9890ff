"""Resctrl intents and the reader of what resctrl offers (`<sys-root>/fs/resctrl`).

Intents: `ResctrlGroupCreate(group)` (mkdir), `ResctrlSchemataWrite(group, schemata)` (write-if-different,
compared per cache id: the kernel pads masks), `ResctrlTasksAdd(group, tids)` (one id per write to
`tasks`, appended; a thread that exited meanwhile is skipped), `ResctrlGroupRemove(group)` (rmdir).
Every path is opened beneath the sys root without following symlinks; group names are single components.
`read_resctrl` reads the L3 mask, the cache ids (root schemata), the CPU vendor and the groups' tasks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.errors import UnsafePathError
from koordqos.fs import READ_FLAGS, WRITE_FLAGS, open_beneath, split_beneath
from koordqos.host.outcome import Batch, HostResult, Outcome
from koordqos.model.resctrl import CLASS_GROUPS, POD_GROUP_PREFIX, parse_cbm, parse_schemata, same_schemata

KIND = "resctrl"
RESCTRL = "fs/resctrl"
# files a synthetic group dir holds; a real resctrl group is removed by rmdir alone
_GROUP_FILES = ("schemata", "tasks", "cpus", "cpus_list", "mode", "size")


def _group(name: str) -> str:
    if len(split_beneath(name)) != 1:
        raise UnsafePathError(f"resctrl group {name!r} is not a single name")
    return name


@dataclass(frozen=True, slots=True)
class ResctrlGroupCreate:
    """Intent: make sure group `group` exists."""

    group: str
    reason: str = ""

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"resctrl/{self.group}"


@dataclass(frozen=True, slots=True)
class ResctrlSchemataWrite:
    """Intent: the group's schemata holds `schemata` (lines `L3:…` / `MB:…`)."""

    group: str
    schemata: str
    reason: str = ""

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"resctrl/{self.group}/schemata"


@dataclass(frozen=True, slots=True)
class ResctrlTasksAdd:
    """Intent: move threads `tids` into the group (each id written on its own)."""

    group: str
    tids: tuple[int, ...]
    reason: str = ""

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"resctrl/{self.group}/tasks"


@dataclass(frozen=True, slots=True)
class ResctrlGroupRemove:
    """Intent: remove pod group `group` (its threads fall back to the root group)."""

    group: str
    reason: str = ""

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"resctrl/{self.group}"


def _dir_fd(batch: Batch) -> int:
    return open_beneath(batch.root("sys"), RESCTRL, os.O_RDONLY | os.O_DIRECTORY)


def apply_create(batch: Batch, w: ResctrlGroupCreate) -> HostResult:
    """mkdir beneath the resctrl root (an existing group is UNCHANGED)."""
    reason = batch.why(w.reason)
    try:
        name = _group(w.group)
        fd = _dir_fd(batch)
    except UnsafePathError as exc:
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason)
    except OSError as exc:
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"resctrl root: {exc.strerror}", reason)
    try:
        try:
            os.stat(name, dir_fd=fd, follow_symlinks=False)
            return batch.done(KIND, w, Outcome.UNCHANGED)
        except FileNotFoundError:
            pass
        if not batch.dry_run:
            try:
                os.mkdir(name, dir_fd=fd)
            except FileExistsError:
                return batch.done(KIND, w, Outcome.UNCHANGED)
            except OSError as exc:  # ENOSPC: no closid left
                err = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                return batch.problem(
                    KIND, w, w.target, Outcome.FAILED, f"mkdir: {exc.strerror} ({err})", reason
                )
        return batch.record(KIND, w, w.target, None, "created", reason, action="create-group")
    finally:
        os.close(fd)


def apply_schemata(batch: Batch, w: ResctrlSchemataWrite) -> HostResult:
    """Write the schemata unless every value is already there."""
    reason = batch.why(w.reason)
    try:
        rel = f"{RESCTRL}/{_group(w.group)}/schemata"
        fd = open_beneath(batch.root("sys"), rel, READ_FLAGS)
        try:
            current = os.read(fd, 65536).decode("ascii", "replace")
        finally:
            os.close(fd)
    except UnsafePathError as exc:
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason, new=w.schemata)
    except (FileNotFoundError, NotADirectoryError):
        if batch.dry_run:  # the group a dry-run did not create
            return batch.record(KIND, w, w.target, None, w.schemata.strip(), reason)
        return batch.done(KIND, w, Outcome.VANISHED)
    except OSError as exc:
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"read: {exc.strerror}", reason)
    old = current.strip()
    if same_schemata(current, w.schemata):
        return batch.done(KIND, w, Outcome.UNCHANGED, old, w.schemata.strip())
    if not batch.dry_run:
        try:
            fd = open_beneath(batch.root("sys"), rel, WRITE_FLAGS)
            try:
                os.write(fd, w.schemata.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as exc:
            err = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return batch.problem(
                KIND, w, w.target, Outcome.FAILED, f"write: {exc.strerror} ({err})", reason, old, w.schemata
            )
    return batch.record(KIND, w, w.target, old, w.schemata.strip(), reason)


def apply_tasks(batch: Batch, w: ResctrlTasksAdd) -> HostResult:
    """Append each thread id (ESRCH: the thread exited, skipped)."""
    reason = batch.why(w.reason)
    new = " ".join(str(t) for t in w.tids)
    if not w.tids or any(t <= 0 for t in w.tids):
        return batch.problem(
            KIND, w, w.target, Outcome.INVALID, "thread ids must be positive", reason, new=new
        )
    if batch.dry_run:
        return batch.record(KIND, w, w.target, None, new, reason, action="add-tasks", quiet=True)
    try:
        fd = open_beneath(batch.root("sys"), f"{RESCTRL}/{_group(w.group)}/tasks", os.O_WRONLY | os.O_APPEND)
    except UnsafePathError as exc:
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason, new=new)
    except (FileNotFoundError, NotADirectoryError):
        return batch.done(KIND, w, Outcome.VANISHED)
    except OSError as exc:
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"open: {exc.strerror}", reason, new=new)
    moved: list[int] = []
    try:
        for tid in w.tids:
            try:
                os.write(fd, f"{tid}\n".encode("ascii"))
                moved.append(tid)
            except ProcessLookupError:
                continue
            except OSError as exc:
                err = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                return batch.problem(
                    KIND, w, w.target, Outcome.FAILED, f"write {tid}: {exc.strerror} ({err})", reason, new=new
                )
    finally:
        os.close(fd)
    if not moved:
        return batch.done(KIND, w, Outcome.VANISHED)
    return batch.record(
        KIND, w, w.target, None, " ".join(map(str, moved)), reason, action="add-tasks", quiet=True
    )


def apply_remove(batch: Batch, w: ResctrlGroupRemove) -> HostResult:
    """rmdir a pod group (only `koordlet-*` groups are ever removed)."""
    reason = batch.why(w.reason)
    if not w.group.startswith(POD_GROUP_PREFIX):
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, "only pod groups are removed", reason)
    try:
        name = _group(w.group)
        fd = _dir_fd(batch)
    except UnsafePathError as exc:
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason)
    except OSError as exc:
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"resctrl root: {exc.strerror}", reason)
    try:
        if batch.dry_run:
            return batch.record(KIND, w, w.target, "present", None, reason, action="remove-group")
        try:
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            return batch.done(KIND, w, Outcome.VANISHED)
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                return batch.problem(KIND, w, w.target, Outcome.FAILED, f"rmdir: {exc.strerror}", reason)
            _remove_synthetic(fd, name)
        return batch.record(KIND, w, w.target, "present", None, reason, action="remove-group")
    finally:
        os.close(fd)


def _remove_synthetic(fd: int, name: str) -> None:
    """A plain-directory stand-in of a group (tests, demos): drop its files, then the dir."""
    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    try:
        for f in _GROUP_FILES:
            try:
                os.unlink(f, dir_fd=sub)
            except FileNotFoundError:
                continue
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=fd)


# -- reading ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResctrlState:
    """What the round reads: None fields mean resctrl (or that part of it) is not there."""

    cbm: int | None
    cache_ids: tuple[int, ...]
    vendor: str
    groups: frozenset[str]
    tasks: dict[str, frozenset[int]] = field(default_factory=dict)
    problem: str = ""


def read_vendor(proc_root: Path | str) -> str:
    """The CPU vendor (`vendor_id` of /proc/cpuinfo), "" when unknown."""
    try:
        with open(Path(proc_root) / "cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip()
    except OSError:
        pass
    return ""


def _ids(text: str) -> frozenset[int]:
    try:
        return frozenset(map(int, text.split()))
    except ValueError:  # not a tasks file as the kernel writes it: keep what parses
        return frozenset(int(t) for t in text.split() if t.isdigit())


def read_group_tasks(
    sys_root: Path | str, present: frozenset[str], groups: Iterable[str] = CLASS_GROUPS
) -> dict[str, frozenset[int]]:
    """The thread ids in the class groups and every pod group that exists."""
    root = Path(sys_root) / RESCTRL
    tasks: dict[str, frozenset[int]] = {}
    for g in {*groups, *(p for p in present if p.startswith(POD_GROUP_PREFIX))}:
        if g in present:
            try:
                tasks[g] = _ids((root / g / "tasks").read_text())
            except OSError:
                tasks[g] = frozenset()
    return tasks


def read_resctrl(
    sys_root: Path | str, vendor: str, groups: Iterable[str] = CLASS_GROUPS, with_tasks: bool = True
) -> ResctrlState:
    """The L3 CAT info and (`with_tasks`) the groups' tasks; `problem` says why resctrl cannot be used."""
    root = Path(sys_root) / RESCTRL
    try:
        cbm_text = (root / "info" / "L3" / "cbm_mask").read_text()
        schemata = (root / "schemata").read_text()
    except OSError:
        return ResctrlState(
            None, (), vendor, frozenset(), problem=f"resctrl with L3 CAT is not mounted at {root}"
        )
    try:
        cbm = parse_cbm(cbm_text)
    except ValueError:
        return ResctrlState(
            None, (), vendor, frozenset(), problem=f"invalid L3 cbm_mask {cbm_text.strip()!r}"
        )
    ids = tuple(sorted(parse_schemata(schemata).get("L3", {})))
    try:
        present = frozenset(e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
    except OSError:
        present = frozenset()
    tasks = read_group_tasks(sys_root, present, groups) if with_tasks else {}
    problem = "" if ids else "no L3 cache id in the resctrl root schemata"
    return ResctrlState(cbm, ids, vendor, present, tasks, problem)
