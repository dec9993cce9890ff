"""What happened to one actuator intent: the outcome shared by the cgroup executor and the host actuator."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """What happened to one intent (a cgroup file, a sysctl, a process, a resctrl group)."""

    WRITTEN = "written"
    DRY_RUN = "dry-run"  # would have been written
    UNCHANGED = "unchanged"  # the target already held the value
    CACHED = "cached"  # skipped by the cgroup executor's cache
    VANISHED = "vanished"  # the cgroup dir or the process does not exist (any more)
    UNSUPPORTED = "unsupported"  # no such file / operation on this node
    INVALID = "invalid"  # value out of range or malformed (or unknown resource)
    REFUSED = "refused"  # path would leave the root or pass through a symlink
    FAILED = "failed"  # the kernel rejected the write / I/O error


#: Outcomes that are problems (logged, counted as errors); vanished/unsupported/unchanged are fine.
PROBLEMS = frozenset({Outcome.INVALID, Outcome.REFUSED, Outcome.FAILED})
