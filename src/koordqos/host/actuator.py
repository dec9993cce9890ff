"""HostActuator: carries out host write intents outside cgroup files (sysctl, oom_score_adj, cookies).

One handler per intent type (`HANDLERS` plus the cookie handlers, which own the cookie caches). `apply`
runs a whole batch in one worker thread (a thread hop costs ~50-100 µs, more than most of these writes:
one hop per batch, none for an empty one); batches are serialised, so handlers need no locking.
Every path is resolved beneath its root when it is opened (`koordqos.fs.open_beneath`). Adding a kind of
write (resctrl, blkio): one module with the intent and its handler, one line in `HANDLERS`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

from koordqos.decisions import DecisionLog
from koordqos.host.coresched import (
    CookieManager,
    CookieOps,
    CoreSchedCookie,
    CoreSchedHandlers,
    CoreSchedPrune,
)
from koordqos.host.oom import OomScoreAdjWrite, apply_oom_score_adj
from koordqos.host.outcome import Batch, Handler, HostResult, Outcome, RootUnavailable
from koordqos.host.resctrl import (
    ResctrlGroupCreate,
    ResctrlGroupRemove,
    ResctrlSchemataWrite,
    ResctrlTasksAdd,
    apply_create,
    apply_remove,
    apply_schemata,
    apply_tasks,
)
from koordqos.host.sysctl import SysctlWrite, apply_sysctl
from koordqos.host.sysfs import SysfsWrite, apply_sysfs
from koordqos.once import SeenOnce

HostIntent = (
    SysctlWrite
    | SysfsWrite
    | OomScoreAdjWrite
    | CoreSchedCookie
    | CoreSchedPrune
    | ResctrlGroupCreate
    | ResctrlSchemataWrite
    | ResctrlTasksAdd
    | ResctrlGroupRemove
)

HANDLERS: dict[type, Handler] = {
    SysctlWrite: apply_sysctl,
    OomScoreAdjWrite: apply_oom_score_adj,
    SysfsWrite: apply_sysfs,
    ResctrlGroupCreate: apply_create,
    ResctrlSchemataWrite: apply_schemata,
    ResctrlTasksAdd: apply_tasks,
    ResctrlGroupRemove: apply_remove,
}


class HostActuator:
    """Applies host intents beneath `proc_root` / `sys_root`; dry-run records and changes nothing."""

    def __init__(
        self,
        decisions: DecisionLog,
        *,
        proc_root: Path | str = "/proc",
        sys_root: Path | str = "/sys",
        dry_run: bool | None = None,
        cookie_ops: CookieOps | None = None,
    ) -> None:
        self.decisions = decisions
        self.roots = {"proc": str(proc_root), "sys": str(sys_root)}
        self._dry_run = dry_run
        self._core_sched = CoreSchedHandlers(cookie_ops)
        self._handlers: dict[type, Handler] = {
            **HANDLERS,
            CoreSchedCookie: self._core_sched.apply_cookie,
            CoreSchedPrune: self._core_sched.apply_prune,
        }
        self._warned: SeenOnce[tuple[str, str]] = SeenOnce()
        self._lock = threading.Lock()
        self.batches = 0

    @property
    def dry_run(self) -> bool:
        """Dry-run: decisions recorded, nothing written (defaults to the decision log's setting)."""
        return self.decisions.dry_run if self._dry_run is None else self._dry_run

    @property
    def cookies(self) -> CookieManager | None:
        """The core-sched cookie caches; None when the kernel offers no core scheduling."""
        return self._core_sched.manager

    async def apply(self, strategy: str, intents: Sequence[HostIntent], reason: str = "") -> list[HostResult]:
        """Apply `intents` in order, off the event loop; one result per intent."""
        if not intents:
            return []
        return await asyncio.to_thread(self.apply_now, strategy, intents, reason)

    def apply_now(self, strategy: str, intents: Sequence[HostIntent], reason: str = "") -> list[HostResult]:
        """Apply `intents` in the calling thread (blocking: for worker threads and tests)."""
        with self._lock:
            self.batches += 1
            batch = Batch(strategy, reason, self.dry_run, self.decisions, self.roots, self._warned)
            try:
                return [self._one(batch, i) for i in intents]
            finally:
                batch.close()

    def _one(self, batch: Batch, intent: HostIntent) -> HostResult:
        handler = self._handlers.get(type(intent))
        if handler is None:
            raise TypeError(f"no host handler for {type(intent).__name__}")
        try:
            return handler(batch, intent)
        except RootUnavailable as exc:
            target = getattr(intent, "target", type(intent).__name__)
            return batch.problem("root", intent, target, Outcome.FAILED, str(exc), batch.reason)
