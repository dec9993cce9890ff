"""CgroupReader: the cgroup counters and settings the metrics collector and strategies read.

Every method takes a relative cgroup dir and returns None when the dir (or file) is missing — a pod that
vanished between listing and reading is normal — or when the content cannot be parsed.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import cast

from koordqos.cgroups.dryrun import DryRunFiles
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.parse import (
    CpuStat,
    MemoryReadings,
    cpu_stat_of,
    int_of,
    memory_readings_of,
    parse_flat_keyed,
    usage_ns_of,
    working_set_of,
)
from koordqos.cgroups.resources import CgroupVersion, parse_cpuset
from koordqos.errors import CgroupError, UnsafePathError
from koordqos.fs import open_beneath, open_root

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
# a dir is opened only to open files beneath it (O_PATH where the OS has it: no read permission needed)
_DIR_FLAGS = os.O_DIRECTORY | getattr(os, "O_PATH", os.O_RDONLY)


CGROUP_FS_TYPES = frozenset({"cgroup", "cgroup2"})


def mount_fs_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """File-system type of the mount holding `path` (longest mount-point prefix), None if unknown."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, fstype = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mnt = fields[4].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, right.split()[0]
    return fstype


def default_max_open_files(soft_limit: int | None) -> int:
    """Cgroup files kept open by default: all but 4,096 of the soft RLIMIT_NOFILE (sockets, logs and the
    runtime's fds fit in those), at least a quarter of it, at most 16,384 (a 1,000-pod node needs ~11,000)."""
    if soft_limit is None:
        return 16384
    return min(16384, max(soft_limit // 4, soft_limit - 4096))


class CgroupReader:
    """Reads usage counters and settings of cgroup dirs (service "cgroup_reader").

    Files are opened beneath the cgroup root one component at a time without following a symlink
    (`koordqos.fs.open_beneath` for the dir, then `openat` of the file in it): a dir swapped for a symlink
    is refused at the open, not at an earlier path check. Files read once stay open and are re-read with
    `pread(fd, 0)` (a kernfs seq_file restarts at offset 0): one syscall instead of open+read+close, ~5x
    cheaper on cgroupfs. On kernfs a removed cgroup's open file fails with ENODEV; on other file systems
    (synthetic trees) a removed file is detected by its link count. The dir fd is closed once its files are
    open (cgroup dirs cannot be renamed, and a removed one is opened again from the root): one fd per file.
    At most `max_open_files` stay open (default: `default_max_open_files`), counting the collector's
    `FileSet`s; beyond it files are opened per read (one dir walk beneath the root each: much slower).
    """

    def __init__(
        self,
        layout: CgroupLayout,
        max_open_files: int | None = None,
        dry_run_files: DryRunFiles | None = None,
    ) -> None:
        self.layout = layout
        # dry-run: the settings read as the executor would have written them (cgroups/dryrun.py)
        self.dry_run_files = dry_run_files
        self._v2 = layout.version is CgroupVersion.V2
        self._root = str(layout.root).rstrip("/") or "/"
        # (subsystem, rel) → the dir's path relative to the root (checked: no `..`, stays inside the root)
        self._dirs: dict[tuple[str, str], str] = {}
        self._fds: dict[tuple[str, str, str], int] = {}  # (subsystem, rel, file name) → open fd
        self.held = 0  # fds held by FileSets
        if max_open_files is None:
            import resource

            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            max_open_files = default_max_open_files(None if soft == resource.RLIM_INFINITY else soft)
        self.max_open_files = max_open_files
        self._check_links = True
        self._detect_fs()
        layout.on_controllers_changed(self._controllers_changed)

    def _detect_fs(self) -> None:
        # on kernfs a removed cgroup's open file fails with ENODEV; elsewhere only the link count tells
        bases = [str(self.layout.subsystem_dir("", s)) for s in ("cpu", "cpuacct", "memory")]
        self._check_links = not all(mount_fs_type(b) in CGROUP_FS_TYPES for b in bases)

    def _controllers_changed(self) -> None:
        """Controller dirs moved (a changed link): forget every memoised dir and open file."""
        self.close()
        self._dirs.clear()
        self._detect_fs()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: os may already be gone
            pass

    def close(self) -> None:
        """Close every cached file descriptor (FileSets close their own)."""
        fds = getattr(self, "_fds", {})
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        fds.clear()

    @property
    def open_files(self) -> int:
        """How many cgroup files are held open for re-reading (by the reader and its FileSets)."""
        return len(self._fds) + self.held

    def _dir(self, rel: str, subsystem: str) -> str:
        """`rel`'s dir in `subsystem`, relative to the cgroup root (PathEscapeError when refused)."""
        key = (subsystem, rel)
        d = self._dirs.get(key)
        if d is None:
            path = str(self.layout.subsystem_dir(rel, subsystem))
            d = path[len(self._root) :].lstrip("/")
            if len(self._dirs) > 65536:
                self._dirs.clear()
            self._dirs[key] = d
        return d

    def open_dir(self, rel: str, subsystem: str) -> int | None:
        """An fd of `rel`'s dir in `subsystem`, opened beneath the root with no symlink followed; None when
        missing or refused. The caller closes it."""
        try:
            d = self._dir(rel, subsystem)
            if not d:
                return open_root(self._root)
            return open_beneath(self._root, d, _DIR_FLAGS)
        except (OSError, CgroupError, UnsafePathError):
            return None

    def forget(self, *rels: str) -> None:
        """Drop memoised dirs and close cached files of the dirs `rels` and below them (after pods went
        away). One pass over the memo for any number of dirs: the pods that leave together (a drain, a
        re-list) are forgotten together, not one memo walk each (1,000 pods: ~1 s in one loop step)."""
        if not rels:
            return
        exact = frozenset(rels)
        below = tuple(r.rstrip("/") + "/" for r in rels)

        def gone(rel: str) -> bool:
            return rel in exact or rel.startswith(below)

        self._dirs = {k: v for k, v in self._dirs.items() if not gone(k[1])}
        for key in [k for k in self._fds if gone(k[1])]:
            os.close(self._fds.pop(key))

    def _read(self, rel: str, subsystem: str, name: str) -> str | None:
        data = self._read_bytes(rel, subsystem, name)
        if data is None:
            return None
        text = data.decode("ascii", "replace")
        files = self.dry_run_files
        if files:
            try:
                d = self._dir(rel, subsystem)
            except CgroupError:
                return text
            return files.view(f"{d}/{name}" if d else name, text)
        return text

    def read_bytes(self, rel: str, subsystem: str, name: str) -> bytes | None:
        """The content of file `name` in `rel`'s dir of `subsystem` (held open and re-read, see the class);
        None when it is missing, refused or unreadable."""
        return self._read_bytes(rel, subsystem, name)

    def _read_bytes(self, rel: str, subsystem: str, name: str) -> bytes | None:
        key = (subsystem, rel, name)
        fd = self._fds.get(key)
        if fd is not None:
            try:
                data = os.pread(fd, 65536, 0)
                if not self._check_links or os.fstat(fd).st_nlink > 0:
                    return data
            except OSError:
                pass
            # removed (ENODEV on kernfs, unlinked elsewhere): drop it and look again
            del self._fds[key]
            os.close(fd)
        dfd = self.open_dir(rel, subsystem)
        if dfd is None:
            return None
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)
        try:
            data = os.read(fd, 65536)
        except OSError:
            os.close(fd)
            return None
        if self.open_files < self.max_open_files:
            self._fds[key] = fd
        else:
            os.close(fd)
        return data

    def file_set(self, files: Sequence[tuple[str, str, str]]) -> FileSet:
        """A FileSet of (rel, subsystem, file name) entries (see FileSet)."""
        return FileSet(self, files)

    def cpu_usage_ns(self, rel: str) -> int | None:
        """Cumulative CPU time in ns (v1 `cpuacct.usage`; v2 `cpu.stat` usage_usec × 1000)."""
        if self._v2:
            return usage_ns_of(self._read_bytes(rel, "cpu", "cpu.stat"), True)
        return usage_ns_of(self._read_bytes(rel, "cpuacct", "cpuacct.usage"), False)

    def cpu_stat(self, rel: str) -> CpuStat | None:
        """Throttling counters: nr_periods, nr_throttled, throttled time (ns)."""
        return cpu_stat_of(self._read_bytes(rel, "cpu", "cpu.stat"))

    def memory_stat(self, rel: str) -> dict[str, int] | None:
        """`memory.stat` as a dict."""
        text = self._read(rel, "memory", "memory.stat")
        return None if text is None else parse_flat_keyed(text)

    def _usage_file(self) -> str:
        return "memory.current" if self._v2 else "memory.usage_in_bytes"

    def memory_usage(self, rel: str) -> int | None:
        """Memory usage in bytes (v1 `memory.usage_in_bytes`, v2 `memory.current`)."""
        return int_of(self._read_bytes(rel, "memory", self._usage_file()))

    def memory_working_set(self, rel: str) -> int | None:
        """Working set = usage − inactive file pages (v1 `total_inactive_file`, v2 `inactive_file`), >= 0."""
        usage = self._read_bytes(rel, "memory", self._usage_file())
        if usage is None:
            return None
        return working_set_of(usage, self._read_bytes(rel, "memory", "memory.stat"), self._v2)

    def memory_readings(self, rel: str) -> MemoryReadings | None:
        """Working set, anonymous memory and anonymous + file pages from one read of `memory.stat`
        (koordlet's `MemoryStatRaw.Usage`: inactive_anon + active_anon + unevictable; v1 `total_` keys)."""
        usage = self._read_bytes(rel, "memory", self._usage_file())
        if usage is None:
            return None
        return memory_readings_of(usage, self._read_bytes(rel, "memory", "memory.stat"), self._v2)

    def cpuset(self, rel: str) -> frozenset[int] | None:
        """The CPUs of `cpuset.cpus` (v2: `cpuset.cpus.effective` when `cpuset.cpus` is empty)."""
        text = self._read(rel, "cpuset", "cpuset.cpus")
        if text is not None and not text.strip() and self._v2:
            text = self._read(rel, "cpuset", "cpuset.cpus.effective")
        if text is None:
            return None
        try:
            return parse_cpuset(text)
        except ValueError:
            return None

    def cpu_quota_period(self, rel: str) -> tuple[int, int] | None:
        """(cfs quota, cfs period) in µs; quota −1 when unlimited."""
        if self._v2:
            text = self._read(rel, "cpu", "cpu.max")
            if text is None:
                return None
            parts = text.split()
            try:
                quota = -1 if parts[0] == "max" else int(parts[0])
                return quota, int(parts[1])
            except (ValueError, IndexError):
                return None
        q = self._read(rel, "cpu", "cpu.cfs_quota_us")
        p = self._read(rel, "cpu", "cpu.cfs_period_us")
        if q is None or p is None:
            return None
        try:
            return int(q), int(p)
        except ValueError:
            return None


def read_procs(layout: CgroupLayout, rel: str) -> list[int] | None:
    """The PIDs in `rel`'s cgroup.procs (cpu hierarchy); None when the dir is gone, refused or unreadable.

    Opened beneath the cgroup root with no symlink followed (`koordqos.fs.open_beneath`). Blocking (a file
    read per dir): callers with many dirs run it in a worker thread.
    """
    try:
        path = str(layout.subsystem_dir(rel, "cpu") / "cgroup.procs")
        root = str(layout.root).rstrip("/")
        fd = open_beneath(root or "/", path[len(root) :].lstrip("/"), os.O_RDONLY)
    except (OSError, CgroupError, UnsafePathError):
        return None
    try:
        chunks = []
        while data := os.read(fd, 65536):
            chunks.append(data)
    except OSError:
        return None
    finally:
        os.close(fd)
    return [int(x) for x in b"".join(chunks).split() if x.isdigit()]


_MAX_READ = 65536  # the most a cgroup file is read for (memory.stat is ~1-2 KiB)


def _size_hint(length: int) -> int:
    """What to read a file for next time: twice its length as a power of two, >= 64 (small reads allocate
    small objects; a result that fills the hint is read again whole)."""
    return min(_MAX_READ, max(64, 1 << (2 * length).bit_length()))


class FileSet:
    """A fixed list of cgroup files held open and re-read together: one `pread` each per round.

    For a reader of many dirs every round (the metrics collector: 3 files per pod and some per container).
    Entries are (rel, subsystem, file name); `read()` returns each file's bytes, or None where the file (or
    its dir) is gone. A file that fails (ENODEV: its cgroup was removed; link count 0 on synthetic trees) is
    closed and opened again from the root on the next read, so a dir removed and made again is followed. Each
    file is read for twice its last length (`_size_hint`); a read that fills it is repeated for 64 KiB. The
    owner calls `close()`; the fds count against the reader's `max_open_files` (beyond it files are opened per
    read).
    """

    __slots__ = ("_dirs", "_fds", "_names", "_reader", "_ready", "_sizes", "_zeros", "entries")

    def __init__(self, reader: CgroupReader, entries: Sequence[tuple[str, str, str]]) -> None:
        self._reader = reader
        self.entries = tuple(entries)
        self._names = [name for _rel, _sub, name in self.entries]
        self._dirs = [(rel, sub) for rel, sub, _name in self.entries]
        self._fds: list[int] = [-1] * len(self.entries)
        self._sizes: list[int] = [_MAX_READ] * len(self.entries)
        self._zeros = [0] * len(self.entries)  # the offsets of the preads
        # every file open and no link count to check (kernfs): read() takes its one-line path
        self._ready = False

    def read(self) -> list[bytes | None]:
        """Every file's content (None where missing); blocking, safe to call from a worker thread."""
        if self._ready:
            sizes = self._sizes
            try:  # C-level loops only: one pread per file
                got: list[bytes] = list(map(os.pread, self._fds, sizes, self._zeros))
            except OSError:  # a file failed (its cgroup was removed): each one again, the careful way
                return self._read_each()
            out = cast("list[bytes | None]", got)
            if any(map(operator.ge, map(len, got), sizes)):  # a read filled its hint: maybe cut short
                for i, n in enumerate(sizes):
                    if len(got[i]) >= n:
                        out[i] = self._read_whole(i)
            return out
        return self._read_each()

    def _read_whole(self, i: int) -> bytes | None:
        """File i read for 64 KiB (its size hint updated), None when that read fails."""
        try:
            data = os.pread(self._fds[i], _MAX_READ, 0)
        except OSError:
            return None
        self._sizes[i] = _size_hint(len(data))
        return data

    def _read_each(self) -> list[bytes | None]:
        out: list[bytes | None] = []
        fds = self._fds
        sizes = self._sizes
        check_links = self._reader._check_links
        missing = False
        for i, fd in enumerate(fds):
            if fd >= 0:
                try:
                    data = os.pread(fd, sizes[i], 0)
                    if len(data) >= sizes[i]:
                        data = os.pread(fd, _MAX_READ, 0)
                        sizes[i] = _size_hint(len(data))
                    if not check_links or os.fstat(fd).st_nlink > 0:
                        out.append(data)
                        continue
                except OSError:
                    pass
                os.close(fd)
                fds[i] = -1
                self._reader.held -= 1
            missing = True
            out.append(None)
        if missing:
            self._reopen(out)
        self._ready = not check_links and all(fd >= 0 for fd in fds)
        return out

    def _reopen(self, out: list[bytes | None]) -> None:
        """Open the files that are not open (their dir once per dir) and read them into `out`."""
        reader = self._reader
        dir_fds: dict[tuple[str, str], int | None] = {}
        try:
            for i, fd in enumerate(self._fds):
                if fd >= 0:
                    continue
                where = self._dirs[i]
                if where not in dir_fds:
                    dir_fds[where] = reader.open_dir(*where)
                dfd = dir_fds[where]
                if dfd is None:
                    continue
                try:
                    fd = os.open(self._names[i], _READ_FLAGS, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    data = os.read(fd, _MAX_READ)
                except OSError:
                    os.close(fd)
                    continue
                out[i] = data
                self._sizes[i] = _size_hint(len(data))
                if reader.open_files < reader.max_open_files:
                    self._fds[i] = fd
                    reader.held += 1
                else:
                    os.close(fd)
        finally:
            for dfd in dir_fds.values():
                if dfd is not None:
                    os.close(dfd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def close(self) -> None:
        """Close the held files."""
        self._ready = False
        for i, fd in enumerate(self._fds):
            if fd >= 0:
                os.close(fd)
                self._fds[i] = -1
                self._reader.held -= 1
