"""Confined file access: open a path beneath a root directory, one component at a time, no symlinks.

Every directory component is opened relative to its parent's fd with `O_NOFOLLOW | O_DIRECTORY`, so a
symlink (or `..`) anywhere below the root is refused when the file is opened, not when a path string was
checked earlier: a component swapped for a symlink between two writes is caught by the second one. The
root itself is trusted (it is a flag: `--proc-root`, `--cgroup-root`, `--sys-root`).
"""

from __future__ import annotations

import errno
import os
import stat

from koordqos.errors import UnsafePathError

# O_PATH: a handle for walking only (no read permission needed on the dirs); not on every OS
_DIR_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)
READ_FLAGS = os.O_RDONLY
WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC


def split_beneath(relpath: str) -> list[str]:
    """The components of a relative path; UnsafePathError for absolute paths, `..`, `.` or empty ones."""
    if not relpath or relpath.startswith("/"):
        raise UnsafePathError(f"not a relative path: {relpath!r}")
    parts = relpath.split("/")
    for p in parts:
        if p in ("", ".", "..") or "\0" in p:
            raise UnsafePathError(f"path component {p!r} refused in {relpath!r}")
    return parts


def open_root(root: str | os.PathLike[str]) -> int:
    """A directory fd for `root` (the caller closes it)."""
    return os.open(root, os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY))


def open_beneath(root: int | str | os.PathLike[str], relpath: str, flags: int, mode: int = 0o644) -> int:
    """Open `relpath` beneath `root` (a dir fd or path) without following any symlink; returns an fd.

    UnsafePathError when a component is a symlink (or not a plain name); OSError (ENOENT, ENOTDIR,
    EACCES, ...) as `os.open` raises it otherwise. `O_CREAT` in `flags` may create the last component only.
    """
    parts = split_beneath(relpath)
    own_root = not isinstance(root, int)
    dir_fd = open_root(root) if not isinstance(root, int) else root
    fd = dir_fd
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                _refuse_symlink(exc, fd, name, relpath)
                raise
            if fd != dir_fd:
                os.close(fd)
            fd = nxt
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        except OSError as exc:
            _refuse_symlink(exc, fd, parts[-1], relpath)
            raise
    finally:
        if fd != dir_fd:
            os.close(fd)
        if own_root:
            os.close(dir_fd)


def _refuse_symlink(exc: OSError, dir_fd: int, name: str, relpath: str) -> None:
    """Turn the errors a symlinked component produces (ELOOP, ENOTDIR, EMLINK) into UnsafePathError."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"symlink {name!r} in {relpath!r} refused") from exc


def read_beneath(root: int | str | os.PathLike[str], relpath: str, limit: int = 65536) -> str:
    """The text of a small (kernel) file beneath `root`."""
    fd = open_beneath(root, relpath, READ_FLAGS)
    try:
        return os.read(fd, limit).decode("ascii", "replace")
    finally:
        os.close(fd)


def subdirs_beneath(root: int | str | os.PathLike[str], relpath: str = "") -> list[str]:
    """Sorted names of the real (non-symlink) sub-dirs of `relpath` beneath `root` ("": the root itself),
    listed through a dir fd opened beneath the root, so a symlinked component is refused, not followed.

    UnsafePathError for a symlinked component; OSError as `os.open` raises it (ENOENT, ...).
    """
    flags = os.O_RDONLY | os.O_DIRECTORY
    if relpath:
        fd = open_beneath(root, relpath, flags)
    elif isinstance(root, int):
        fd = os.open(".", flags | os.O_CLOEXEC, dir_fd=root)
    else:
        fd = os.open(root, flags | os.O_CLOEXEC)
    try:
        with os.scandir(fd) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    finally:
        os.close(fd)


def write_beneath(root: int | str | os.PathLike[str], relpath: str, text: str) -> None:
    """Write `text` to an existing (kernel) file beneath `root` (never created)."""
    fd = open_beneath(root, relpath, WRITE_FLAGS)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
