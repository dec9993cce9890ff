"""DryRunFiles: what a dry-run would have written, so that it decides next as a real run would.

In `--dry-run` no cgroup file changes. Planned again from the unchanged files, every round decided the same
write again (CPU suppress recorded `-1 -> 260000` every second), and a change a real run makes in steps
(CPU suppress's 10 % recovery, CPU burst's ×1.2) never took its next step: the decisions were not those of a
real run (issue #32, item 5g). The executor notes each would-be value here with the content the file had;
reads of that file (the executor's own compare, `CgroupExecutor.read`, the cgroup reader's settings) see the
would-be value while the file still has that content. A file changed by someone else since shows its own
content again, as a real run would see it. Keys are paths relative to the cgroup root. Empty (and never
consulted) outside dry-run. Files whose content after a write cannot be told from the write (a device line
of a blkio or io file holding every device's) are not noted: a dry-run decides those again every round.
"""

from __future__ import annotations

from koordqos.cgroups.resources import CgroupVersion, Resource

CFS_QUOTA = "cpu.cfs_quota_us"

MAX_FILES = 65536  # bounded: forgotten all at once beyond it (the next rounds decide those writes again)


class DryRunFiles:
    """Would-be contents of cgroup files, by path relative to the cgroup root."""

    __slots__ = ("_files",)

    def __init__(self) -> None:
        self._files: dict[str, tuple[str, str]] = {}  # path → (the file's content then, stripped; would-be)

    def __len__(self) -> int:
        return len(self._files)

    def note(self, path: str, actual: str, would: str) -> None:
        """A dry-run would have written `would` over the file's `actual` content."""
        files = self._files
        if len(files) >= MAX_FILES and path not in files:
            files.clear()
        files[path] = (actual.strip(), would)

    def view(self, path: str, actual: str) -> str:
        """The content a real run would read: the would-be value while the file is as it was, else `actual`
        (and the note is dropped)."""
        noted = self._files.get(path)
        if noted is None:
            return actual
        if noted[0] != actual.strip():
            del self._files[path]
            return actual
        return noted[1]

    def forget(self, path: str) -> None:
        """The file is gone."""
        self._files.pop(path, None)

    def clear(self) -> None:
        """Forget every note (every cached value was distrusted)."""
        self._files.clear()


def read_back(res: Resource, version: CgroupVersion, current: str, written: str) -> str | None:
    """What the file reads after `written` went over `current`; None when that cannot be told."""
    if not res.numeric and not res.name.startswith("cpuset."):
        return None  # a line of a multi-line (per-device) file
    if version is CgroupVersion.V2 and res.name == CFS_QUOTA:
        parts = current.split()  # cpu.max: "quota period", the period kept
        return f"{written} {parts[1]}" if len(parts) == 2 else None
    return written


def rel_of(path: str, root: str) -> str:
    """`path` relative to `root` (the key of `DryRunFiles`)."""
    return path[len(root.rstrip("/")) :].lstrip("/")
