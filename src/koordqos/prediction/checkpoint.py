"""Model checkpoints (docs/prediction.md, "Checkpoint file", "Restore"): koordlet's file format, and the
directory.

* `encode` / `decode`: one JSON object and a newline, Go's field names and number/time formats:
  `{"UID": …, "CPU": H, "Memory": H, "LastUpdated": "<RFC 3339>"}` with H =
  `{"referenceTimestamp": "<RFC 3339>", "bucketWeights": {"<bucket>": <uint32>, …}, "totalWeight": <float>}`
  (`bucketWeights` / `totalWeight` left out when empty / zero; `LastUpdated` is the time of saving). A file
  koordlet wrote restores here and the other way round.
* `restore_plan`: which files of a directory listing are restored, deleted or skipped (pure).
* `CheckpointDir`: the directory: one file per model named by its UID, written to `<UID>.tmp` and renamed;
  every file opened beneath the directory without following symlinks (`koordqos.fs`); the bytes of the
  agent's own files bounded. Blocking: the caller runs it off the event loop.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from koordqos.errors import UnsafePathError
from koordqos.fs import open_beneath, open_root
from koordqos.prediction.histogram import HistogramCheckpoint

NS = 1_000_000_000
#: a checkpoint file larger than this is not one of the agent's (205 + 158 buckets fit in ~5 KB)
MAX_FILE_BYTES = 64 << 10
TMP_SUFFIX = ".tmp"
_UINT32_MAX = (1 << 32) - 1
#: what a model UID may be to become a file name: a Kubernetes uid or `__node…__` (no `/`, no leading `.`)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})$"
)
_ZERO_TIME_TEXT = "0001-01-01T00:00:00Z"
_ZERO_TIME_NS = -62_135_596_800 * NS


class CheckpointError(ValueError):
    """Not a checkpoint this agent can read."""


def valid_name(uid: str) -> bool:
    """A UID that can be a checkpoint file name in the directory (no path separator, not hidden)."""
    return bool(_NAME.match(uid)) and not uid.endswith(TMP_SUFFIX)


@dataclass(frozen=True, slots=True)
class ModelCheckpoint:
    """One model's file: histograms (None: absent in the file, a load error) and the save time (ns; 0 is
    the zero time)."""

    uid: str
    cpu: HistogramCheckpoint | None
    memory: HistogramCheckpoint | None
    last_updated_ns: int


# -- Go's text formats ---------------------------------------------------------------------------------------


def go_float(value: float) -> str:
    """A float64 as Go's encoding/json writes it: the shortest digits, positional unless the exponent is
    below −6 or at 21 and more (then `1e+21`, `1e-7`)."""
    if not math.isfinite(value):
        raise CheckpointError(f"not a JSON number: {value!r}")
    if value == 0:
        return "0"
    shortest = repr(value)
    a = abs(value)
    if a < 1e-6 or a >= 1e21:
        mantissa, _, exp = f"{Decimal(shortest):e}".partition("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        sign = exp[0] if exp[0] in "+-" else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"  # Go cleans e-07 to e-7; positive ones are ≥ 21
        return f"{mantissa}e{sign}{digits}"
    text = format(Decimal(shortest), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_time(t_ns: int | None, *, nanos: bool = True) -> str:
    """RFC 3339 in UTC (Go's time.Time JSON: fraction without trailing zeros); None is the zero time."""
    if t_ns is None or t_ns == _ZERO_TIME_NS:
        return _ZERO_TIME_TEXT
    seconds, frac = divmod(t_ns, NS)
    dt = _EPOCH + timedelta(seconds=seconds)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos and frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + "Z"


def parse_time(text: str) -> int | None:
    """RFC 3339 (any offset, optional fraction) → ns since the epoch; None for the zero time."""
    m = _RFC3339.match(text)
    if not m:
        raise CheckpointError(f"not an RFC 3339 time: {text[:64]!r}")
    year, month, day, hour, minute, sec = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7) or "", m.group(8)
    try:
        dt = datetime(year, month, day, hour, minute, sec, tzinfo=UTC)
    except ValueError as exc:
        raise CheckpointError(f"invalid time {text[:64]!r}: {exc}") from None
    offset = 0
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    delta = dt - _EPOCH
    ns = (delta.days * 86400 + delta.seconds - offset) * NS + int(frac.ljust(9, "0") or 0)
    return None if ns == _ZERO_TIME_NS else ns


# -- encode / decode -----------------------------------------------------------------------------------------


def _histogram_json(cp: HistogramCheckpoint) -> str:
    parts = [f'"referenceTimestamp":{json.dumps(format_time(cp.reference_ns))}']
    if cp.bucket_weights:
        # Go sorts map keys by their text: "100" before "22"
        items = sorted((str(b), q) for b, q in cp.bucket_weights.items())
        parts.append('"bucketWeights":{' + ",".join(f'"{b}":{q}' for b, q in items) + "}")
    if cp.total_weight != 0:
        parts.append(f'"totalWeight":{go_float(cp.total_weight)}')
    return "{" + ",".join(parts) + "}"


def encode(uid: str, cpu: HistogramCheckpoint, memory: HistogramCheckpoint, saved_at_ns: int) -> bytes:
    """A model's file: the JSON object (Go's field order and formats) and a newline."""
    text = (
        "{"
        f'"UID":{json.dumps(uid)},'
        f'"CPU":{_histogram_json(cpu)},'
        f'"Memory":{_histogram_json(memory)},'
        f'"LastUpdated":{json.dumps(format_time(saved_at_ns - saved_at_ns % NS, nanos=False))}'
        "}\n"
    )
    return text.encode()


def _reject_constant(name: str) -> Any:
    raise CheckpointError(f"{name} is not JSON")


def _histogram(raw: Any, what: str) -> HistogramCheckpoint | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{what}: expected an object")
    ref_text = raw.get("referenceTimestamp", _ZERO_TIME_TEXT)
    if not isinstance(ref_text, str):
        raise CheckpointError(f"{what}.referenceTimestamp: expected a string")
    reference = parse_time(ref_text)
    weights_raw = raw.get("bucketWeights")
    weights: dict[int, int] = {}
    if weights_raw is not None:
        if not isinstance(weights_raw, Mapping):
            raise CheckpointError(f"{what}.bucketWeights: expected an object")
        for key, value in weights_raw.items():
            if not re.fullmatch(r"[+-]?[0-9]{1,9}", key):
                raise CheckpointError(f"{what}.bucketWeights: bucket {key[:32]!r} is not an integer")
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _UINT32_MAX:
                raise CheckpointError(f"{what}.bucketWeights[{key}]: expected a uint32")
            weights[int(key)] = value
    total = raw.get("totalWeight", 0.0)
    if not isinstance(total, int | float) or isinstance(total, bool):
        raise CheckpointError(f"{what}.totalWeight: expected a number")
    return HistogramCheckpoint(reference, weights, float(total))


def decode(data: bytes, name: str) -> ModelCheckpoint:
    """A file's content → its checkpoint (the UID is the file name, as koordlet's); CheckpointError when it
    is not one of the agent's checkpoints (not JSON, wrong types, or a `UID` other than the name)."""
    if len(data) > MAX_FILE_BYTES:
        raise CheckpointError(f"{len(data)} bytes: larger than a checkpoint")
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise CheckpointError("expected a JSON object")
    uid = doc.get("UID")
    if uid != name:
        raise CheckpointError(f"UID {str(uid)[:64]!r} is not the file name")
    last = doc.get("LastUpdated", _ZERO_TIME_TEXT)
    if not isinstance(last, str):
        raise CheckpointError("LastUpdated: expected a string")
    last_ns = parse_time(last)
    return ModelCheckpoint(
        name, _histogram(doc.get("CPU"), "CPU"), _histogram(doc.get("Memory"), "Memory"), last_ns or 0
    )


# -- restore -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One name in the directory as listed: its bytes (a regular file, at most MAX_FILE_BYTES), or why it
    was not read."""

    name: str
    data: bytes | None = None
    problem: str = ""


Action = Literal["restore", "delete", "skip"]


@dataclass(frozen=True, slots=True)
class RestoreItem:
    """What a restore does with one entry: restore it, delete it (the agent's own: a leftover `.tmp`, a
    model whose UID is no longer known), or skip it (corrupt or foreign: logged and counted)."""

    name: str
    action: Action
    checkpoint: ModelCheckpoint | None = None
    reason: str = ""
    invalid: bool = False  # not a checkpoint of the agent's (corrupt or foreign)


def restore_plan(
    entries: Iterable[DirEntry], known: Collection[str], *, delete_invalid: bool = False
) -> list[RestoreItem]:
    """Decide each entry (docs/prediction.md, "Restore", with its project decision): `.tmp` leftovers of a
    model name are deleted; checkpoints of known UIDs restored; checkpoints of unknown UIDs deleted; what is
    not a checkpoint of the agent's is skipped — or, with `delete_invalid` (koordlet), deleted."""
    out: list[RestoreItem] = []
    for e in entries:
        if e.name.endswith(TMP_SUFFIX) and valid_name(e.name[: -len(TMP_SUFFIX)]):
            out.append(RestoreItem(e.name, "delete", reason="unfinished write"))
            continue
        if e.data is None:
            out.append(RestoreItem(e.name, "delete" if delete_invalid else "skip", None, e.problem, True))
            continue
        try:
            cp = decode(e.data, e.name)
        except CheckpointError as exc:
            out.append(RestoreItem(e.name, "delete" if delete_invalid else "skip", None, str(exc), True))
            continue
        if e.name in known:
            out.append(RestoreItem(e.name, "restore", cp))
        else:
            out.append(RestoreItem(e.name, "delete", reason="model no longer known"))
    return out


# -- the directory -------------------------------------------------------------------------------------------


@dataclass
class CheckpointDir:
    """The checkpoint directory: `<dir>/<UID>`, at most `max_bytes` of the agent's own files."""

    path: Path
    max_bytes: int = 16 << 20
    sizes: dict[str, int] = field(default_factory=dict)  # the agent's files and their sizes

    @property
    def used_bytes(self) -> int:
        """Bytes of the agent's checkpoint files."""
        return sum(self.sizes.values())

    def names(self) -> list[str]:
        """The directory's top-level names, sorted (OSError: missing or unreadable)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # readable: scandir needs it
        try:
            with os.scandir(fd) as it:
                return sorted(entry.name for entry in it)
        finally:
            os.close(fd)

    def read(self, names: Iterable[str]) -> list[DirEntry]:
        """Each name's entry: the content of a regular file, or why it was not read (OSError: the directory
        itself cannot be opened)."""
        fd = open_root(self.path)
        try:
            return [self._read(fd, name) for name in names]
        finally:
            os.close(fd)

    def scan(self) -> list[DirEntry]:
        """Every top-level entry with the content of each regular file (OSError: the directory is missing or
        unreadable; nothing is then restored or deleted)."""
        return self.read(self.names())

    def _read(self, dir_fd: int, name: str) -> DirEntry:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            return DirEntry(name, problem=f"stat: {exc.strerror}")
        if not stat.S_ISREG(st.st_mode):
            return DirEntry(name, problem="not a regular file")
        if name.endswith(TMP_SUFFIX):
            return DirEntry(name, b"")
        if st.st_size > MAX_FILE_BYTES:
            return DirEntry(name, problem=f"{st.st_size} bytes: larger than a checkpoint")
        try:
            fd = open_beneath(dir_fd, name, os.O_RDONLY)
        except (OSError, UnsafePathError) as exc:
            return DirEntry(name, problem=f"open: {exc}")
        try:
            data = os.read(fd, MAX_FILE_BYTES + 1)
        except OSError as exc:
            return DirEntry(name, problem=f"read: {exc.strerror}")
        finally:
            os.close(fd)
        return DirEntry(name, data)

    def note(self, name: str, size: int) -> None:
        """Count a restored file as the agent's own."""
        self.sizes[name] = size

    def save(self, uid: str, data: bytes) -> None:
        """Write `<uid>.tmp`, rename it to `<uid>`; OSError / ValueError (a name that cannot be a file, the
        byte bound reached: nothing written)."""
        if not valid_name(uid):
            raise ValueError(f"model UID {uid[:64]!r} cannot be a file name")
        after = self.used_bytes - self.sizes.get(uid, 0) + len(data)
        if after > self.max_bytes:
            raise ValueError(f"checkpoint directory would hold {after} bytes (bound {self.max_bytes})")
        dir_fd = open_root(self.path)
        try:
            tmp = uid + TMP_SUFFIX
            fd = open_beneath(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.rename(tmp, uid, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        self.sizes[uid] = len(data)

    def remove(self, name: str) -> bool:
        """Delete `<dir>/<name>`; False when it was not there (OSError for other failures)."""
        self.sizes.pop(name, None)
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a file name: {name[:64]!r}")
        dir_fd = open_root(self.path)
        try:
            os.unlink(name, dir_fd=dir_fd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(dir_fd)
