"""terway's QoS config files (docs/network-qos.md, "terway-qos"): `global_bps_config` and `pod.json` in one
directory.

`TerwayFiles(dir).sync(files)` makes the directory hold exactly what `files` says: a name with text is
written when its content differs (to a temporary file in the same directory, then renamed over the old one,
so terway never reads half a file), a name with None is removed. The directory is created when missing;
a symlink in its place, or as one of the files, is refused. Synchronous: the caller runs it off the loop.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

GLOBAL_CONFIG = "global_bps_config"
POD_CONFIG = "pod.json"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class TerwaySync:
    """What one sync did: names written, names removed, and the errors by name."""

    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def _read(dir_fd: int, name: str) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _write(dir_fd: int, name: str, text: str) -> None:
    tmp = f".{name}.koordqos.tmp"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
    )
    try:
        data = text.encode()
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


class TerwayFiles:
    """The terway QoS directory (`--terway-qos-dir`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def sync(self, files: Mapping[str, str | None]) -> TerwaySync:
        """Write or remove each file as `files` says; errors are reported, never raised."""
        out = TerwaySync()
        if all(v is None for v in files.values()) and not self.directory.is_dir():
            return out  # nothing to write and nothing there to remove: do not create the directory
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(self.directory, _DIR_FLAGS)
        except OSError as exc:
            for name in files:
                out.errors[name] = f"{self.directory}: {exc.strerror or exc}"
            return out
        try:
            for name, text in files.items():
                try:
                    if text is None:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name, dir_fd=dir_fd)
                            out.removed.append(name)
                    elif _read(dir_fd, name) != text:
                        _write(dir_fd, name, text)
                        out.written.append(name)
                except OSError as exc:
                    out.errors[name] = exc.strerror or str(exc)
        finally:
            os.close(dir_fd)
        return out
