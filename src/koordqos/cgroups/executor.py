"""CgroupExecutor: turns `CgroupWrite` intents into cgroup file writes.

Semantics (docs/behaviour-qos-manager.md, "Cgroup writes"):
* write-if-different: the current content is read first and compared semantically; equal → no write;
* cacheable intents are skipped while the cached value is unchanged and younger than
  `force_update_seconds` (60 s), so an external change is corrected within that time;
* `apply` is leveled: pass 1 walks QoS → pod → container writing, for mergeable resources (cfs quota,
  cpusets, memory.min/low/high), the looser of current and new, and plain resources directly; pass 2 walks
  container → pod → QoS writing the exact mergeable values. A parent is thus never tighter than a child in
  between (cgroup v1 rejects such writes anyway);
* memory-limit writes (which may block in reclaim) run in a worker thread; the rest are direct `os` calls;
* "dir vanished" and "unsupported" are outcomes, not errors; paths outside the cgroup root are refused;
* every write (or would-be write in dry-run) and every failure goes to the decision log.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.dryrun import DryRunFiles, read_back, rel_of
from koordqos.cgroups.layout import PATH_REFUSED, CgroupLayout, ResourceUnsupported
from koordqos.cgroups.resources import (
    RESOURCES,
    Merge,
    Resource,
    get_resource,
    merged_value,
    parse_cpuset,
    parse_current,
    render,
    same_value,
    validate,
)
from koordqos.decisions import DecisionLog
from koordqos.errors import CgroupError, PathEscapeError, UnsafePathError
from koordqos.fs import open_beneath
from koordqos.once import SeenOnce
from koordqos.outcome import PROBLEMS as _PROBLEMS
from koordqos.outcome import Outcome as Outcome  # noqa: PLC0414 (re-exported)

log = structlog.get_logger("koordqos.cgroups.executor")

# Intents applied between yields to the loop: unchanged or cached intents never await anything, and a
# 200-pod reconcile pass is ~1,800 of them (~30 ms in one step otherwise).
YIELD_EVERY_INTENTS = 100
# ... or sooner when they do write: a real write costs 20-200 µs, so 100 of them can hold the loop > 5 ms
YIELD_AFTER_SECONDS = 0.002

CGROUP_WRITES = Counter(
    "koordqos_cgroup_writes_total",
    "Cgroup write intents by resource and outcome",
    ["resource", "outcome"],
    registry=obs.REGISTRY,
)

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


class Level(enum.IntEnum):
    """Where in the hierarchy a write lands; leveled batches order by it."""

    QOS = 0
    POD = 1
    CONTAINER = 2


@dataclass(frozen=True, slots=True)
class CgroupWrite:
    """Intent: set logical `resource` (v1 name, e.g. "cpu.cfs_quota_us") of relative dir `parent`.

    The one cgroup write intent of koordqos: hooks, the reconciler and QoS strategies all produce it.
    `cacheable` writes may be skipped while the same value was written recently; `reason` (when set)
    replaces the batch's reason in the decision log.
    """

    parent: str
    resource: str
    value: int | str
    level: Level = Level.POD
    cacheable: bool = True
    reason: str = ""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The outcome of one intent, with the file's content before and the text written (or to write)."""

    write: CgroupWrite
    outcome: Outcome
    old: str | None = None
    new: str | None = None
    error: str = ""
    error_code: int = 0  # errno of a failed write (EINVAL: a value this kernel refuses)

    @property
    def ok(self) -> bool:
        """Not invalid, refused or failed (vanished/unsupported count as fine)."""
        return self.outcome not in _PROBLEMS


class ConfinedPath(str):
    """A file path that must be opened beneath `root` (the cgroup root), not by its string."""

    root: str

    def __new__(cls, path: str, root: os.PathLike[str] | str) -> ConfinedPath:
        out = super().__new__(cls, path)
        out.root = str(root).rstrip("/")
        return out


def _open(path: os.PathLike[str] | str, flags: int) -> int:
    """`os.open`; for a ConfinedPath one component at a time beneath its root with no symlink followed
    (koordqos.fs), so the confinement holds at the open, whatever a dir was swapped for since a check."""
    if not isinstance(path, ConfinedPath):
        return os.open(path, flags)
    if not path.startswith(path.root + "/"):
        raise UnsafePathError(f"{str(path)!r} is not beneath {path.root!r}")
    return open_beneath(path.root, path[len(path.root) + 1 :], flags)


def read_file(path: os.PathLike[str] | str) -> str:
    """Read a small kernel file (a ConfinedPath beneath its root without following symlinks)."""
    fd = _open(path, _READ_FLAGS)
    try:
        return os.read(fd, 65536).decode("ascii", "replace")
    finally:
        os.close(fd)


def write_file(path: os.PathLike[str] | str, text: str) -> None:
    """Write a small kernel file (must already exist: cgroup files are never created); confined as read."""
    fd = _open(path, _WRITE_FLAGS)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def _refusal(exc: UnsafePathError) -> str:
    return f"{exc}: not followed, it could lead outside the cgroup root"


class CgroupExecutor:
    """Applies cgroup write intents; shared by every strategy and hook (service "executor")."""

    def __init__(
        self,
        layout: CgroupLayout,
        decisions: DecisionLog,
        *,
        force_update_seconds: float = 60.0,
        dry_run: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self.decisions = decisions
        self.force_update_seconds = force_update_seconds
        self._dry_run = dry_run
        self._clock = clock
        # (parent, resource) → (value, when written), oldest write first: an entry is of use only within
        # force_update_seconds, and `_remember` drops expired ones as it goes, so the dirs of containers
        # that went away (a restarted container in a pod that stays) do not pile up until their pod goes
        self._cache: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._paths: dict[tuple[str, str], str] = {}  # (parent, resource) → confined file path
        # dir → when `invalidate` was called for it (and what is under it), oldest first: a cached value
        # written before then is not trusted. Kept for one force-update period, after which every value
        # cached before it has expired anyway.
        self._invalidated: OrderedDict[str, float] = OrderedDict()
        self._counters: dict[tuple[str, str], Any] = {}
        self._warned: SeenOnce[tuple[str, str]] = SeenOnce()
        self.file_reads = 0
        self.file_writes = 0
        # dry-run: what it would have written, read back as a real run reads its writes (cgroups/dryrun.py)
        self.dry_run_files = DryRunFiles()
        layout.on_controllers_changed(self.invalidate)  # cached paths start at the old controller dirs

    @property
    def dry_run(self) -> bool:
        """Dry-run: decisions recorded, nothing written (defaults to the decision log's setting)."""
        return self.decisions.dry_run if self._dry_run is None else self._dry_run

    # -- public API ----------------------------------------------------------------------------------------

    async def apply(
        self, strategy: str, writes: Sequence[CgroupWrite], reason: str = ""
    ) -> list[WriteResult]:
        """Apply a leveled batch (loosen top-down, exact bottom-up); one result per intent, in input order."""
        results: list[WriteResult | None] = [None] * len(writes)
        order = sorted(range(len(writes)), key=lambda i: writes[i].level)
        deferred: list[int] = []
        pace = _Pace()
        for step, i in enumerate(order, 1):  # pass 1: top → bottom
            await pace.step(step)
            w = writes[i]
            res = self._resource(w)
            if res is None or res.merge is Merge.NONE:
                results[i] = await self._write(strategy, reason, w)
                continue
            early = await self._loosen(strategy, reason, w, res)
            if early is not None:
                results[i] = early
            else:
                deferred.append(i)
        for step, i in enumerate(sorted(deferred, key=lambda i: writes[i].level, reverse=True), 1):
            await pace.step(step)  # pass 2: bottom → top
            results[i] = await self._write(strategy, reason, writes[i])
        return [r for r in results if r is not None]

    async def apply_sequential(
        self, strategy: str, writes: Sequence[CgroupWrite], reason: str = ""
    ) -> list[WriteResult]:
        """Apply intents exactly in the given order, without the leveled merge pass."""
        out = []
        pace = _Pace()
        for step, w in enumerate(writes, 1):
            await pace.step(step)
            out.append(await self._write(strategy, reason, w))
        return out

    async def update(self, strategy: str, write: CgroupWrite, reason: str = "") -> WriteResult:
        """Apply a single intent."""
        return await self._write(strategy, reason, write)

    def read(self, parent: str, resource: str) -> str | None:
        """Raw content of `resource`'s file in `parent`; None if the dir/file is missing or unsupported."""
        try:
            path = ConfinedPath(str(self.layout.file_path(parent, resource)), self.layout.root)
            self.file_reads += 1
            text = read_file(path)
        except (OSError, CgroupError, UnsafePathError):  # missing, unsupported, refused
            return None
        if self.dry_run_files:
            return self.dry_run_files.view(rel_of(path, str(self.layout.root)), text)
        return text

    def read_value(self, parent: str, resource: str) -> int | str | None:
        """The current logical value (ints, -1 for unlimited); None when missing or unparsable."""
        res = get_resource(resource)
        text = self.read(parent, resource)
        if text is None:
            return None
        try:
            return parse_current(res, self.layout.version, text)
        except (ValueError, IndexError):
            return None

    def invalidate(self, parent: str = "") -> None:
        """Distrust the values cached for the dir `parent` and every dir under it (all of them when empty),
        so the next intents there are re-checked: a pod's dir may be made again (a sandbox re-created) with
        the kernel's defaults. O(1): noted, not swept — the cache holds the values of every pod, and
        rebuilding it for one pod cost 2–6 ms at 1,000 pods (docs/performance-history.md, session 30); the
        values themselves expire within a force-update period."""
        if not parent:
            self._cache.clear()
            self._paths.clear()
            self._invalidated.clear()
            self.dry_run_files.clear()
            return
        marks = self._invalidated
        now = self._clock()
        key = parent.rstrip("/")
        marks[key] = now
        marks.move_to_end(key)
        while True:  # marks older than a period guard nothing: every value cached before them has expired
            oldest = next(iter(marks), None)  # None: emptied (with a period of 0 no mark guards anything)
            if oldest is None or now - marks[oldest] < self.force_update_seconds:
                break
            del marks[oldest]

    def _distrusted(self, parent: str, written: float) -> bool:
        """Whether `parent` or a dir above it was invalidated at or after `written`."""
        marks = self._invalidated
        d = parent
        while True:
            when = marks.get(d)
            if when is not None and when >= written:
                return True
            cut = d.rfind("/")
            if cut <= 0:
                return False
            d = d[:cut]

    # -- internals --------------------------------------------------------------------------------

    def _resource(self, w: CgroupWrite) -> Resource | None:
        try:
            return get_resource(w.resource)
        except CgroupError:
            return None

    async def _loosen(self, strategy: str, reason: str, w: CgroupWrite, res: Resource) -> WriteResult | None:
        """Pass-1 step for a mergeable intent: write the looser value; a result ends the intent early."""
        reason = w.reason or reason
        if w.cacheable and self._cache_hit(w):
            return self._done(w, Outcome.CACHED)
        pre = self._precheck(strategy, reason, w)
        if isinstance(pre, WriteResult):
            return pre
        current = self.read_value(w.parent, w.resource)
        if current is None:
            return None  # pass 2 reports vanished/unsupported
        merged = merged_value(res, current, w.value)
        if _same_logical(res, merged, current):
            return None  # nothing to loosen: pass 2 writes the exact value
        if _same_logical(res, merged, w.value):
            # loosening *is* the exact value: write it now, top-down, and skip pass 2
            return await self._write(strategy, reason, w)
        loosen = replace(w, value=merged, cacheable=False)
        result = await self._write(strategy, reason, loosen, action="write-loosen")
        if not result.ok:
            return WriteResult(w, result.outcome, result.old, result.new, result.error)
        return None

    def _precheck(self, strategy: str, reason: str, w: CgroupWrite) -> WriteResult | tuple[str, Resource]:
        try:
            res = get_resource(w.resource)
        except CgroupError as exc:
            return self._problem(strategy, reason, w, Outcome.INVALID, str(exc))
        if not self.layout.supports(res):
            return self._done(w, Outcome.UNSUPPORTED)
        key = (w.parent, w.resource)
        try:
            path = self._paths.get(key) or self._path(key, res)
        except PathEscapeError as exc:
            return self._problem(strategy, reason, w, Outcome.REFUSED, str(exc))
        except ResourceUnsupported:
            return self._done(w, Outcome.UNSUPPORTED)
        try:
            validate(res, w.value)
        except CgroupError as exc:
            return self._problem(strategy, reason, w, Outcome.INVALID, str(exc))
        return path, res

    def _path(self, key: tuple[str, str], res: Resource) -> str:
        path = ConfinedPath(str(self.layout.file_path(key[0], res)), self.layout.root)
        if len(self._paths) > 65536:
            self._paths.clear()
        self._paths[key] = path
        return path

    def _cache_hit(self, w: CgroupWrite) -> bool:
        # only values that were written (so known, supported, valid and confined) are ever cached
        hit = self._cache.get((w.parent, w.resource))
        if hit is None or hit[0] != str(w.value) or self._clock() - hit[1] >= self.force_update_seconds:
            return False
        return not (self._invalidated and self._distrusted(w.parent, hit[1]))

    async def _write(self, strategy: str, reason: str, w: CgroupWrite, action: str = "write") -> WriteResult:
        reason = w.reason or reason
        if w.cacheable and self._cache_hit(w):
            return self._done(w, Outcome.CACHED)
        pre = self._precheck(strategy, reason, w)
        if isinstance(pre, WriteResult):
            return pre
        path, res = pre
        try:
            self.file_reads += 1
            current = read_file(path)
        except UnsafePathError as exc:
            PATH_REFUSED.labels("symlink").inc()
            return self._problem(strategy, reason, w, Outcome.REFUSED, _refusal(exc))
        except (FileNotFoundError, NotADirectoryError):
            return self._missing(w, path)
        except OSError as exc:
            return self._problem(strategy, reason, w, Outcome.FAILED, f"read {path}: {exc.strerror}")
        dry, actual, rel = self.dry_run, current, ""
        if (
            dry
        ):  # compare with what the dry-run would have written here, as a real run compares with its write
            rel = rel_of(path, str(self.layout.root))
            current = self.dry_run_files.view(rel, actual)
        new = render(res, w.value, self.layout.version, current)
        if same_value(res, self.layout.version, current, new):
            self._remember(w)
            return self._done(w, Outcome.UNCHANGED, current.strip(), new)
        target = f"{w.parent}/{w.resource}"
        if dry:
            self.decisions.record(strategy, target, action, current.strip(), new, reason, dry_run=True)
            would = read_back(res, self.layout.version, current, new)
            if would is not None:
                self.dry_run_files.note(rel, actual, would)
            self._remember(w)
            return self._done(w, Outcome.DRY_RUN, current.strip(), new)
        try:
            self.file_writes += 1
            if res.blocking:
                await asyncio.to_thread(write_file, path, new)
            else:
                write_file(path, new)
        except UnsafePathError as exc:
            # a dir swapped for a symlink after the read: refused at the write itself
            PATH_REFUSED.labels("symlink").inc()
            return self._problem(
                strategy, reason, w, Outcome.REFUSED, _refusal(exc), old=current.strip(), new=new
            )
        except (FileNotFoundError, NotADirectoryError):
            return self._missing(w, path)
        except OSError as exc:
            err = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return self._problem(
                strategy,
                reason,
                w,
                Outcome.FAILED,
                f"write {new!r} to {path}: {exc.strerror} ({err})",
                old=current.strip(),
                new=new,
                error_code=exc.errno or 0,
            )
        self._remember(w)
        if w.resource == "cpu.idle":
            # the kernel sets the weight of a group whose cpu.idle changed (its idle weight, or back to the
            # default): a cached cpu.shares of the dir no longer says what the file holds
            self._cache.pop((w.parent, "cpu.shares"), None)
        self.decisions.record(strategy, target, action, current.strip(), new, reason, dry_run=False)
        return self._done(w, Outcome.WRITTEN, current.strip(), new)

    def _remember(self, w: CgroupWrite) -> None:
        if not w.cacheable:
            return
        cache = self._cache
        key = (w.parent, w.resource)
        now = self._clock()
        cache[key] = (str(w.value), now)
        cache.move_to_end(key)
        # drop up to two expired entries from the old end per write: O(1) each, never a sweep in one step,
        # and twice the rate new entries come in, so the cache holds about the writes of one period
        for _ in range(2):
            oldest = next(iter(cache), None)  # None: emptied (a period of 0 expires what it just wrote)
            if oldest is None or now - cache[oldest][1] < self.force_update_seconds:
                break
            del cache[oldest]

    def _missing(self, w: CgroupWrite, path: str) -> WriteResult:
        self._cache.pop((w.parent, w.resource), None)
        if self.dry_run_files:
            self.dry_run_files.forget(rel_of(path, str(self.layout.root)))
        self._paths.pop((w.parent, w.resource), None)
        if os.path.isdir(os.path.dirname(path)):
            return self._done(w, Outcome.UNSUPPORTED)
        return self._done(w, Outcome.VANISHED)

    def _done(
        self, w: CgroupWrite, outcome: Outcome, old: str | None = None, new: str | None = None
    ) -> WriteResult:
        key = (w.resource, outcome.value)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = CGROUP_WRITES.labels(*key)
        counter.inc()
        return WriteResult(w, outcome, old, new)

    def _problem(
        self,
        strategy: str,
        reason: str,
        w: CgroupWrite,
        outcome: Outcome,
        error: str,
        old: str | None = None,
        new: str | None = None,
        error_code: int = 0,
    ) -> WriteResult:
        resource = w.resource if w.resource in RESOURCES else "unknown"
        CGROUP_WRITES.labels(resource, outcome.value).inc()
        obs.ERRORS.labels("cgroup-executor", outcome.value).inc()
        key = (f"{w.parent}/{w.resource}", outcome.value)
        if self._warned.first(key):
            log.warning(
                "cgroup write not applied",
                strategy=strategy,
                parent=w.parent,
                resource=w.resource,
                value=w.value,
                outcome=outcome.value,
                error=error,
            )
        self.decisions.record(
            strategy,
            f"{w.parent}/{w.resource}",
            f"write-{outcome.value}",
            old,
            new if new is not None else w.value,
            f"{reason}: {error}" if reason else error,
            quiet=True,
        )
        return WriteResult(w, outcome, old, new, error, error_code)


class _Pace:
    """Yield to the loop every YIELD_EVERY_INTENTS intents or YIELD_AFTER_SECONDS, whichever comes first."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since = time.perf_counter()

    async def step(self, n: int) -> None:
        now = time.perf_counter()
        if n % YIELD_EVERY_INTENTS == 0 or now - self._since >= YIELD_AFTER_SECONDS:
            await asyncio.sleep(0)
            self._since = time.perf_counter()


def _same_logical(res: Resource, a: int | str, b: int | str) -> bool:
    if res.merge is Merge.LOOSER:
        try:
            return parse_cpuset(str(a)) == parse_cpuset(str(b))
        except ValueError:
            return False
    return str(a) == str(b)
