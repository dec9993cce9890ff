"""OomScoreAdjWrite: set `/proc/<pid>/oom_score_adj` (write-if-different; a gone process is VANISHED)."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from koordqos.errors import UnsafePathError
from koordqos.fs import READ_FLAGS, WRITE_FLAGS, open_beneath
from koordqos.host.outcome import Batch, HostResult, Outcome

KIND = "oom_score_adj"
MIN_OOM_SCORE_ADJ = -1000
MAX_OOM_SCORE_ADJ = 1000
_GONE = (errno.ENOENT, errno.ESRCH)  # no such pid dir / the process exited between read and write


@dataclass(frozen=True, slots=True)
class OomScoreAdjWrite:
    """Intent: write `value` to the oom_score_adj of process `pid`."""

    pid: int
    value: int
    reason: str = ""

    @property
    def target(self) -> str:
        """The decision-log target."""
        return f"pid/{self.pid}/oom_score_adj"


def apply_oom_score_adj(batch: Batch, w: OomScoreAdjWrite) -> HostResult:
    """Read, compare, write one process's oom_score_adj (recorded quietly: one decision per process)."""
    reason = batch.why(w.reason)
    new = str(w.value)
    if w.pid <= 0 or not MIN_OOM_SCORE_ADJ <= w.value <= MAX_OOM_SCORE_ADJ:
        return batch.problem(KIND, w, w.target, Outcome.INVALID, "pid or value out of range", reason, new=new)
    rel = f"{w.pid}/oom_score_adj"
    try:
        fd = open_beneath(batch.root("proc"), rel, READ_FLAGS)
        try:
            text = os.read(fd, 64).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        current = int(text)
    except UnsafePathError as exc:
        return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason, new=new)
    except OSError as exc:
        if exc.errno in _GONE:
            return batch.done(KIND, w, Outcome.VANISHED)
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"read: {exc.strerror}", reason, new=new)
    except ValueError:
        return batch.problem(KIND, w, w.target, Outcome.FAILED, f"unparsable value {text!r}", reason, new=new)
    old = str(current)
    if current == w.value:
        return batch.done(KIND, w, Outcome.UNCHANGED, old, new)
    if not batch.dry_run:
        try:
            fd = open_beneath(batch.root("proc"), rel, WRITE_FLAGS)
            try:
                os.write(fd, new.encode("ascii"))
            finally:
                os.close(fd)
        except UnsafePathError as exc:
            return batch.problem(KIND, w, w.target, Outcome.REFUSED, str(exc), reason, old, new)
        except OSError as exc:
            if exc.errno in _GONE:
                return batch.done(KIND, w, Outcome.VANISHED)
            err = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return batch.problem(
                KIND, w, w.target, Outcome.FAILED, f"write: {exc.strerror} ({err})", reason, old, new
            )
    return batch.record(KIND, w, w.target, current, w.value, reason, quiet=True)
