"""DecisionLog: every action `{time, strategy, target, action, old, new, reason, dry_run}`, bounded."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from koordqos import observability as obs

log = structlog.get_logger("koordqos.decision")
_COUNTERS: dict[tuple[str, str, bool], Any] = {}  # (strategy, action, dry_run) -> counter child


@dataclass(frozen=True, slots=True)
class Decision:
    """One action taken, or that would have been taken in dry-run."""

    time: float
    strategy: str
    target: str
    action: str
    old: Any = None
    new: Any = None
    reason: str = ""
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return asdict(self)


#: the longest text a decision keeps of its target, reason and old/new values (4,096 decisions of ~1 MiB pod
#: names from a hostile runtime would otherwise be 4 GiB); real ones are a few hundred characters at most
FIELD_CHARS = 1024


class DecisionLog:
    """Bounded ring buffer of decisions; each one is also counted and logged."""

    def __init__(self, size: int = 4096, dry_run: bool = False) -> None:
        # the fields of each Decision, in order: made into Decision objects only when read (the NRI reply
        # path records one per call; a frozen dataclass costs more to build than the tuple)
        self._ring: deque[tuple[Any, ...]] = deque(maxlen=size)
        self.dry_run = dry_run

    def record(
        self,
        strategy: str,
        target: str,
        action: str,
        old: Any = None,
        new: Any = None,
        reason: str = "",
        *,
        dry_run: bool | None = None,
        quiet: bool = False,
    ) -> None:
        """Record one decision; `quiet` skips the info log line (high-volume no-op decisions)."""
        dry = self.dry_run if dry_run is None else dry_run
        # the ring keeps at most FIELD_CHARS of each text: targets and values quote pod data of any length (a
        # str slice within its length is the str itself: no copy for the usual, short ones)
        if type(old) is str:
            old = old[:FIELD_CHARS]
        if type(new) is str:
            new = new[:FIELD_CHARS]
        fields = (time.time(), strategy, target[:FIELD_CHARS], action, old, new, reason[:FIELD_CHARS], dry)
        self._ring.append(fields)
        key = (strategy, action, dry)
        counter = _COUNTERS.get(key)
        if counter is None:  # labelled child resolved once: `labels()` costs more than `inc()`
            counter = _COUNTERS[key] = obs.DECISIONS.labels(strategy, action, str(dry).lower())
        counter.inc()
        if not quiet:
            log.info(
                "decision",
                strategy=strategy,
                target=target,
                action=action,
                old=old,
                new=new,
                reason=reason,
                dry_run=dry,
            )

    def last(self) -> Decision | None:
        """The newest decision, if any."""
        ring = self._ring
        return Decision(*ring[-1]) if ring else None

    def recent(self, limit: int | None = None, strategy: str | None = None) -> list[Decision]:
        """Newest-last decisions, optionally filtered by strategy."""
        # a snapshot first: worker threads (oom_score_adj, core-sched cookies) append while HTTP reads
        items: Iterable[tuple[Any, ...]] = list(self._ring)
        if strategy:
            items = [d for d in items if d[1] == strategy]
        out = [Decision(*d) for d in items]
        return out[-limit:] if limit else out

    def __len__(self) -> int:
        return len(self._ring)
