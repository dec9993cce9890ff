"""SysfsWrite: set a kernel knob beneath `<sys-root>` (memcg reaper, page-cache limit, sched_features).

Write-if-different like a sysctl; `compare=False` writes unconditionally (sched_features lists every
feature, and the caller already decided which one to flip). A file missing on this kernel is UNSUPPORTED.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from koordqos.errors import UnsafePathError
from koordqos.fs import READ_FLAGS, WRITE_FLAGS, open_beneath, read_beneath
from koordqos.host.outcome import Batch, HostResult, Outcome

KIND = "sysfs"


@dataclass(frozen=True, slots=True)
class SysfsWrite:
    """Intent: write `value` to `path`, relative to the sys root (e.g. "kernel/mm/memcg_reaper/...")."""

    path: str
    value: str
    reason: str = ""
    compare: bool = True

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"sys/{self.path}"


def apply_sysfs(batch: Batch, w: SysfsWrite) -> HostResult:
    """Read, compare (unless told not to), write."""
    reason = batch.why(w.reason)
    if not w.value.strip() or not w.value.isascii() or "\0" in w.value:
        return batch.problem(
            KIND, w, w.target, Outcome.INVALID, "value must be ASCII text", reason, new=w.value
        )
    try:
        fd = open_beneath(batch.root("sys"), w.path, READ_FLAGS)
        try:
            current = os.read(fd, 65536).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
    except UnsafePathError as exc:
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason, new=w.value)
    except (FileNotFoundError, NotADirectoryError):
        return batch.done(KIND, w, Outcome.UNSUPPORTED)
    except OSError as exc:
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"read: {exc.strerror}", reason, new=w.value)
    if w.compare and current.split() == w.value.split():
        return batch.done(KIND, w, Outcome.UNCHANGED, current, w.value.strip())
    if not batch.dry_run:
        try:
            fd = open_beneath(batch.root("sys"), w.path, WRITE_FLAGS)
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
    return batch.record(KIND, w, w.target, current, w.value.strip(), reason)


def read_beneath_or_none(root: str | os.PathLike[str], relpath: str) -> str | None:
    """A small kernel file's text beneath `root` (no symlink followed); None when it cannot be read."""
    try:
        return read_beneath(root, relpath)
    except (OSError, UnsafePathError):
        return None
