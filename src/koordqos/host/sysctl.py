"""SysctlWrite: set a sysctl under `<proc-root>/sys` (write-if-different, confined, dry-run aware)."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from koordqos.errors import UnsafePathError
from koordqos.fs import READ_FLAGS, WRITE_FLAGS, open_beneath
from koordqos.host.outcome import Batch, HostResult, Outcome

KIND = "sysctl"


@dataclass(frozen=True, slots=True)
class SysctlWrite:
    """Intent: write `value` to sysctl `name`, a path beneath /proc/sys (e.g. "kernel/sched_core")."""

    name: str
    value: str
    reason: str = ""

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"sysctl/{self.name}"


def same_sysctl(current: str, value: str) -> bool:
    """Equal up to whitespace (multi-value sysctls are printed tab-separated)."""
    return current.split() == value.split()


def apply_sysctl(batch: Batch, w: SysctlWrite) -> HostResult:
    """Read, compare, write; a sysctl missing on this kernel is UNSUPPORTED."""
    reason = batch.why(w.reason)
    if not w.value.strip() or not w.value.isascii() or "\0" in w.value or "\n" in w.value.strip():
        return batch.problem(
            KIND, w, w.target, Outcome.INVALID, "value must be one line of ASCII", reason, new=w.value
        )
    rel = f"sys/{w.name}"
    try:
        fd = open_beneath(batch.root("proc"), rel, READ_FLAGS)
        try:
            current = os.read(fd, 65536).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
    except UnsafePathError as exc:
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason, new=w.value)
    except FileNotFoundError:
        return batch.done(KIND, w, Outcome.UNSUPPORTED)
    except OSError as exc:
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"read: {exc.strerror}", reason, new=w.value)
    if same_sysctl(current, w.value):
        return batch.done(KIND, w, Outcome.UNCHANGED, current, w.value)
    if not batch.dry_run:
        try:
            # resolved again for the write: a component swapped meanwhile is refused here
            fd = open_beneath(batch.root("proc"), rel, WRITE_FLAGS)
            try:
                os.write(fd, w.value.encode("ascii"))
            finally:
                os.close(fd)
        except UnsafePathError as exc:
            return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason, current, w.value)
        except OSError as exc:
            err = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return batch.problem(
                KIND, w, w.target, Outcome.FAILED, f"write: {exc.strerror} ({err})", reason, current, w.value
            )
    return batch.record(KIND, w, w.target, current, w.value, reason)
