"""What every host handler shares: the outcome of one intent and the batch it runs in.

A handler (one per intent type, in its own module) gets a `Batch`: the roots as directory fds, dry-run,
and `done` / `problem` / `record`, which count every outcome, log each distinct problem once and put
writes, would-be writes and problems in the decision log. Handlers never raise for host conditions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.decisions import DecisionLog
from koordqos.fs import open_root
from koordqos.once import SeenOnce
from koordqos.outcome import PROBLEMS as PROBLEMS  # noqa: PLC0414 (re-exported)
from koordqos.outcome import Outcome as Outcome  # noqa: PLC0414 (re-exported)

log = structlog.get_logger("koordqos.host")

HOST_WRITES = Counter(
    "koordqos_host_writes_total",
    "Host write intents (sysctl, oom_score_adj, core-sched cookies) by kind and outcome",
    ["kind", "outcome"],
    registry=obs.REGISTRY,
)


_COUNTERS: dict[tuple[str, str], Any] = {}  # label lookups cost more than a procfs write; children kept


def _count(kind: str, outcome: Outcome) -> None:
    key = (kind, outcome.value)
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = _COUNTERS[key] = HOST_WRITES.labels(*key)
    counter.inc()


class RootUnavailable(Exception):
    """A root directory (e.g. `--proc-root`) cannot be opened; every intent beneath it fails."""


@dataclass(frozen=True, slots=True)
class HostResult:
    """The outcome of one intent, with the value before and the value written (or to write)."""

    intent: object
    outcome: Outcome
    old: str | None = None
    new: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        """Not invalid, refused or failed (vanished/unsupported/unchanged are fine)."""
        return self.outcome not in PROBLEMS


@dataclass
class Batch:
    """One `HostActuator.apply` call as its handlers see it (runs in one worker thread)."""

    strategy: str
    reason: str
    dry_run: bool
    decisions: DecisionLog
    roots: dict[str, str]  # root name ("proc", "sys") → directory
    warned: SeenOnce[tuple[str, str]]
    _fds: dict[str, int] = field(default_factory=dict)

    def root(self, name: str) -> int:
        """The directory fd of root `name`, opened once per batch (RootUnavailable when it cannot be)."""
        fd = self._fds.get(name)
        if fd is None:
            try:
                fd = self._fds[name] = open_root(self.roots[name])
            except OSError as exc:
                raise RootUnavailable(f"{name} root {self.roots[name]}: {exc.strerror}") from exc
        return fd

    def close(self) -> None:
        """Close the root fds."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def why(self, intent_reason: str) -> str:
        """The intent's own reason, else the batch's."""
        return intent_reason or self.reason

    def done(
        self, kind: str, intent: object, outcome: Outcome, old: str | None = None, new: str | None = None
    ) -> HostResult:
        """Count a non-problem outcome."""
        _count(kind, outcome)
        return HostResult(intent, outcome, old, new)

    def record(
        self,
        kind: str,
        intent: object,
        target: str,
        old: Any,
        new: Any,
        reason: str,
        *,
        action: str = "write",
        quiet: bool = False,
    ) -> HostResult:
        """A write (or, in dry-run, a would-be write): decision log (values as given) + count."""
        self.decisions.record(
            self.strategy, target, action, old, new, reason, dry_run=self.dry_run, quiet=quiet
        )
        outcome = Outcome.DRY_RUN if self.dry_run else Outcome.WRITTEN
        return self.done(kind, intent, outcome, None if old is None else str(old), str(new))

    def problem(
        self,
        kind: str,
        intent: object,
        target: str,
        outcome: Outcome,
        error: str,
        reason: str,
        old: str | None = None,
        new: str | None = None,
    ) -> HostResult:
        """A refused, invalid or failed intent: counted, logged once per (target, outcome), recorded."""
        _count(kind, outcome)
        obs.ERRORS.labels("host-actuator", outcome.value).inc()
        if self.warned.first((target, outcome.value)):
            log.warning(
                "host write not applied",
                strategy=self.strategy,
                target=target,
                value=new,
                outcome=outcome.value,
                error=error,
            )
        self.decisions.record(
            self.strategy,
            target,
            f"write-{outcome.value}",
            old,
            new,
            f"{reason}: {error}" if reason else error,
            quiet=True,
        )
        return HostResult(intent, outcome, old, new, error)


Handler = Callable[[Batch, Any], HostResult]
