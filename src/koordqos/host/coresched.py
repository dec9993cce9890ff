"""Core-scheduling cookies: the intents, the cookie caches and the prctl operations behind them.

`CoreSchedCookie` gives a container's processes the cookie of its core-sched group (or clears it);
`CoreSchedPrune` forgets containers and processes that are gone. The caches (`CookieManager`) live here,
with the actuator, because they mirror kernel state: which cookie each group has and which PIDs carry it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from koordqos.host.outcome import Batch, HostResult, Outcome

KIND = "core_sched"


@dataclass(frozen=True, slots=True)
class CoreSchedCookie:
    """Intent: the processes `pids` of a container carry `group`'s cookie (`enable`) or none."""

    pod_uid: str
    container_id: str
    pids: tuple[int, ...]
    enable: bool
    group: str = ""
    reason: str = ""

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"core-sched/{self.pod_uid}/{self.container_id}"


@dataclass(frozen=True, slots=True)
class CoreSchedPrune:
    """Intent: forget containers not in `live_containers` ("<pod uid>/<container id>") and dead PIDs."""

    live_containers: frozenset[str]


# -- kernel operations ------------------------------------------------------------------------------------


class CookieOps(Protocol):
    """Core-scheduling cookie operations on thread groups."""

    def get(self, pid: int) -> int:
        """The cookie of `pid` (0 = none); OSError on failure."""
        ...

    def create(self, pid: int) -> int:
        """Give `pid`'s thread group a new cookie and return it; OSError on failure."""
        ...

    def assign(self, from_pid: int, pids: Sequence[int]) -> list[int]:
        """Copy `from_pid`'s cookie to `pids`; return the pids that failed."""
        ...

    def clear(self, pids: Sequence[int]) -> list[int]:
        """Reset the cookie of `pids` to 0; return the pids that failed."""
        ...


PR_SCHED_CORE = 62
PR_SCHED_CORE_GET = 0
PR_SCHED_CORE_CREATE = 1
PR_SCHED_CORE_SHARE_TO = 2
PR_SCHED_CORE_SHARE_FROM = 3
PIDTYPE_PID = 0
PIDTYPE_TGID = 1


class PrctlCookieOps:
    """CookieOps through prctl(PR_SCHED_CORE). Sharing goes through the calling thread's cookie."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _prctl(self, op: int, pid: int, scope: int, arg: int = 0) -> None:
        if self._libc.prctl(PR_SCHED_CORE, op, pid, scope, ctypes.c_void_p(arg) if arg else 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def get(self, pid: int) -> int:
        """The cookie of `pid`."""
        cookie = ctypes.c_ulonglong(0)
        if self._libc.prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, pid, PIDTYPE_PID, ctypes.byref(cookie)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(cookie.value)

    def create(self, pid: int) -> int:
        """New cookie on the thread group of `pid`."""
        self._prctl(PR_SCHED_CORE_CREATE, pid, PIDTYPE_TGID)
        return self.get(pid)

    def assign(self, from_pid: int, pids: Sequence[int]) -> list[int]:
        """Pull the cookie into this thread, push it to each target, then drop it again."""
        self._prctl(PR_SCHED_CORE_SHARE_FROM, from_pid, PIDTYPE_PID)
        failed = []
        try:
            for pid in pids:
                try:
                    self._prctl(PR_SCHED_CORE_SHARE_TO, pid, PIDTYPE_TGID)
                except OSError:
                    failed.append(pid)
        finally:
            self._reset_self()
        return failed

    def clear(self, pids: Sequence[int]) -> list[int]:
        """Push this thread's (empty) cookie to each target."""
        self._reset_self()
        failed = []
        for pid in pids:
            try:
                self._prctl(PR_SCHED_CORE_SHARE_TO, pid, PIDTYPE_TGID)
            except OSError:
                failed.append(pid)
        return failed

    def _reset_self(self) -> None:
        # init never carries a cookie; copying it back leaves this thread without one
        self._prctl(PR_SCHED_CORE_SHARE_FROM, 1, PIDTYPE_PID)


# -- caches -----------------------------------------------------------------------------------------------


@dataclass
class CookieEntry:
    """A group's cookie and the PIDs known to carry it."""

    cookie: int
    pids: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class CookieChange:
    """What one enable/disable did: PIDs changed, PIDs that failed, and an error that stopped it."""

    changed: int = 0
    failed: int = 0
    error: str = ""


class CookieManager:
    """Cookie and group caches; `enable` / `disable` one container's PIDs."""

    def __init__(self, ops: CookieOps) -> None:
        self.ops = ops
        self.cookies: dict[str, CookieEntry] = {}
        self.groups: dict[str, str] = {}  # "<pod uid>/<container id>" → group

    def enable(self, pod_uid: str, container_id: str, group: str, pids: Sequence[int]) -> CookieChange:
        """Make every PID of the container carry the group's cookie."""
        if not pids:
            return CookieChange()
        key = f"{pod_uid}/{container_id}"
        entry = self.cookies.get(group)
        if entry is not None and entry.cookie:
            if set(pids) <= entry.pids:
                self.groups[key] = group
                return CookieChange()
            change = self._assign(entry, pids)
            if change is not None:
                self.groups[key] = group
                return change
        change = self._add(group, pids)
        self.groups[key] = group
        return change

    def _assign(self, entry: CookieEntry, pids: Sequence[int]) -> CookieChange | None:
        sibling = None
        for pid in sorted(entry.pids):
            try:
                if self.ops.get(pid) == entry.cookie:
                    sibling = pid
                    break
            except OSError:
                continue
        if sibling is None:
            return None
        todo = []
        for pid in pids:
            try:
                if self.ops.get(pid) != entry.cookie:
                    todo.append(pid)
                else:
                    entry.pids.add(pid)
            except OSError:
                continue
        failed = set(self.ops.assign(sibling, todo)) if todo else set()
        entry.pids.update(p for p in todo if p not in failed)
        return CookieChange(len(todo) - len(failed), len(failed))

    def _add(self, group: str, pids: Sequence[int]) -> CookieChange:
        try:
            cookie = self.ops.create(pids[0])
        except OSError as exc:
            return CookieChange(failed=len(pids), error=f"create a cookie on pid {pids[0]}: {exc.strerror}")
        failed = set(self.ops.assign(pids[0], list(pids[1:]))) if len(pids) > 1 else set()
        self.cookies[group] = CookieEntry(cookie, {pids[0], *(p for p in pids[1:] if p not in failed)})
        return CookieChange(len(pids) - len(failed), len(failed))

    def prune(self, live_containers: Collection[str], proc_root: Path) -> None:
        """Forget containers not seen any more, PIDs no longer under `proc_root`, and emptied cookies.

        A dead PID left in a group could be reused by a new process, which `enable` would then take as
        already carrying the cookie; an unpruned cache also grows with every container ever seen.
        """
        live = set(live_containers)
        for key in [k for k in self.groups if k not in live]:
            del self.groups[key]
        for entry in self.cookies.values():
            entry.pids = {pid for pid in entry.pids if (proc_root / str(pid)).exists()}
        # a cookie with no live carrier cannot be shared again (assign needs a sibling); the next
        # enable of the group creates a fresh one
        for group in [g for g, e in self.cookies.items() if not e.pids]:
            del self.cookies[group]

    def disable(self, pod_uid: str, container_id: str, pids: Sequence[int]) -> CookieChange:
        """Clear the cookie of the container's PIDs (only if it had a group)."""
        key = f"{pod_uid}/{container_id}"
        group = self.groups.pop(key, None)
        if group is None:
            return CookieChange()
        todo = []
        for pid in pids:
            try:
                if self.ops.get(pid) != 0:
                    todo.append(pid)
            except OSError:
                continue
        failed = set(self.ops.clear(todo)) if todo else set()
        entry = self.cookies.get(group)
        if entry is not None:
            entry.pids.difference_update(p for p in todo if p not in failed)
        return CookieChange(len(todo) - len(failed), len(failed))


# -- handlers ---------------------------------------------------------------------------------------------


class CoreSchedHandlers:
    """The two cookie handlers over one CookieManager (None: no core scheduling on this kernel)."""

    def __init__(self, ops: CookieOps | None) -> None:
        self.manager = CookieManager(ops) if ops is not None else None

    def apply_cookie(self, batch: Batch, c: CoreSchedCookie) -> HostResult:
        """Enable or clear one container's cookie; dry-run records only."""
        reason = batch.why(c.reason)
        action = "core-sched-enable" if c.enable else "core-sched-disable"
        if self.manager is None:
            return batch.done(KIND, c, Outcome.UNSUPPORTED)
        if not c.pids:
            return batch.done(KIND, c, Outcome.VANISHED)
        if batch.dry_run:
            return batch.record(KIND, c, c.target, None, c.group, reason, action=action)
        if c.enable:
            change = self.manager.enable(c.pod_uid, c.container_id, c.group, c.pids)
        else:
            change = self.manager.disable(c.pod_uid, c.container_id, c.pids)
        if change.error or (change.failed and not change.changed):
            error = change.error or f"{change.failed} of {len(c.pids)} processes refused"
            return batch.problem(KIND, c, c.target, Outcome.FAILED, error, reason, new=c.group)
        if not change.changed:
            return batch.done(KIND, c, Outcome.UNCHANGED, new=c.group)
        why = f"{reason} ({change.failed} processes refused)" if change.failed else reason
        return batch.record(KIND, c, c.target, None, c.group, why, action=action)

    def apply_prune(self, batch: Batch, p: CoreSchedPrune) -> HostResult:
        """Forget what is gone from the caches (a cache update, nothing written to the host)."""
        if self.manager is not None:
            self.manager.prune(p.live_containers, Path(batch.roots["proc"]))
        return batch.done(KIND, p, Outcome.UNCHANGED)
