"""Resource registry: logical cgroup resources → v1 subsystem + file / v2 file, validation, v2 conversion.

A logical resource keeps its cgroup v1 name ("cpu.shares", "cpu.cfs_quota_us", …) whatever the hierarchy;
`render` validates a value and turns it into the text to write on the detected version, `same_value`
compares a file's current content with a rendered value semantically (cpusets as sets,
`max` == 9223372036854775807, the quota field of `cpu.max`). Pure: no I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from koordqos.errors import CgroupError
from koordqos.model.cpuset import cpu_set, format_cpuset

CFS_BASE_PERIOD = 100_000
MAX_INT64 = 9_223_372_036_854_775_807
# v1 memory counters report "unlimited" as LONG_MAX rounded down to a page (PAGE_COUNTER_MAX * 4096).
UNLIMITED_FLOOR = 9_223_372_036_854_771_712


class Merge(enum.Enum):
    """How a leveled batch loosens a resource top-down before writing exact values bottom-up."""

    NONE = "none"  # written once, in the top-down pass
    LARGER = "larger"  # numeric; -1 (unlimited) is the largest
    LOOSER = "looser"  # cpuset: union of current and new


class CgroupVersion(enum.StrEnum):
    """The cgroup hierarchy holding the controllers."""

    V1 = "v1"
    V2 = "v2"


Validator = Callable[[int | str], str | None]  # returns an error message, or None when valid


@dataclass(frozen=True, slots=True)
class Resource:
    """One logical cgroup resource (named after its v1 file)."""

    name: str
    subsystem: str  # v1 subsystem directory (cpu, cpuacct, cpuset, memory, blkio, net_cls)
    v1_file: str | None  # None: not available on v1
    v2_file: str | None  # None: not available on v2
    validate: Validator
    merge: Merge = Merge.NONE
    blocking: bool = False  # the write may block in reclaim: run it in a worker thread
    standard: bool = True  # present wherever the controller is enabled (vs. kernel-specific extension)
    numeric: bool = True
    root_only: bool = False  # exists only in the hierarchy's root dir (blkio/io cost qos and model)

    def file(self, version: CgroupVersion) -> str | None:
        """The file name on `version`, None when the resource does not exist there."""
        return self.v1_file if version is CgroupVersion.V1 else self.v2_file


# -- validators ----------------------------------------------------------------------------------


def _as_int(value: int | str) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(value.strip())
    except ValueError:
        return None


def int_range(lo: int | None, hi: int | None) -> Validator:
    """Validator: an integer in [lo, hi] (either bound may be open)."""

    def check(value: int | str) -> str | None:
        v = _as_int(value)
        if v is None:
            return f"not an integer: {value!r}"
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            return f"{v} out of range [{'' if lo is None else lo}, {'' if hi is None else hi}]"
        return None

    return check


def _quota(value: int | str) -> str | None:
    v = _as_int(value)
    if v is None:
        return f"not an integer: {value!r}"
    if v == -1 or v >= 1000:
        return None
    return f"cfs quota {v} must be -1 or >= 1000"


def _limit(value: int | str) -> str | None:
    v = _as_int(value)
    if v is None:
        return f"not an integer: {value!r}"
    return None if v >= -1 else f"memory limit {v} must be -1 or >= 0"


def _cpuset(value: int | str) -> str | None:
    if not isinstance(value, str):
        return f"cpuset must be a string, got {value!r}"
    try:
        parse_cpuset(value)
    except ValueError as exc:
        return str(exc)
    return None


_DEVICE_LINE = re.compile(r"^\d+:\d+ \d+$")
_DEVICE_KV_LINE = re.compile(r"^\d+:\d+( [a-z]+=[0-9.]+| [a-z]+=[a-z]+)+$")


def _device_value(value: int | str) -> str | None:
    if isinstance(value, str) and _DEVICE_LINE.match(value.strip()):
        return None
    return f"expected 'MAJOR:MINOR VALUE', got {value!r}"


def _device_weight(value: int | str) -> str | None:
    problem = _device_value(value)
    if problem is not None:
        return problem
    weight = int(str(value).split()[1])
    return None if 1 <= weight <= 100 else f"weight {weight} out of range [1, 100]"


def _device_kv(value: int | str) -> str | None:
    if isinstance(value, str) and _DEVICE_KV_LINE.match(value.strip()):
        return None
    return f"expected 'MAJOR:MINOR key=value ...', got {value!r}"


# Per-device files hold one line per device; a write sets one device's entry. The value a device has when
# it is absent from the file: throttles are unlimited (0), the weight is the default 100.
DEVICE_DEFAULTS = {
    "blkio.throttle.read_iops_device": "0",
    "blkio.throttle.read_bps_device": "0",
    "blkio.throttle.write_iops_device": "0",
    "blkio.throttle.write_bps_device": "0",
    "blkio.cost.weight": "100",
}
# cgroup v2 (project decision): the four throttles are keys of io.max ("0" = "max"), the weight is io.weight
IO_MAX_KEYS = {
    "blkio.throttle.read_iops_device": "riops",
    "blkio.throttle.read_bps_device": "rbps",
    "blkio.throttle.write_iops_device": "wiops",
    "blkio.throttle.write_bps_device": "wbps",
}
DEVICE_KV_RESOURCES = frozenset({"blkio.cost.qos", "blkio.cost.model"})


def parse_device_lines(text: str) -> dict[str, str]:
    """A per-device file → {"MAJ:MIN": rest of the line} (lines not starting with a device are skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        dev, _, rest = line.strip().partition(" ")
        if ":" in dev and dev.replace(":", "").isdigit():
            out[dev] = rest.strip()
    return out


def _kv(text: str) -> dict[str, str]:
    return dict(p.partition("=")[::2] for p in text.split() if "=" in p)


def _same_number(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def _same_device_entry(name: str, version: CgroupVersion, current: str, rendered: str) -> bool:
    dev, _, want = rendered.strip().partition(" ")
    have = parse_device_lines(current).get(dev)
    if name in DEVICE_KV_RESOURCES or (version is CgroupVersion.V2 and name in IO_MAX_KEYS):
        have_kv = _kv(have or "")
        return all(
            _same_number(have_kv.get(k, "max" if name in IO_MAX_KEYS else ""), v)
            for k, v in _kv(want).items()
        )
    default = DEVICE_DEFAULTS.get(name, "")
    return (have if have is not None else default) == want.strip()


# -- cpusets -------------------------------------------------------------------------------------

MAX_CPU_ID = 1 << 16


def parse_cpuset(text: str) -> frozenset[int]:
    """Parse a kernel cpu list ("0-3,8,10-11"; "" is empty) into a set; ValueError on malformed text."""
    cpus = cpu_set(text)
    if cpus and max(cpus) >= MAX_CPU_ID:
        raise ValueError(f"malformed cpuset range in {text!r}")
    return cpus


# -- conversions ---------------------------------------------------------------------------------


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu.shares → v2 cpu.weight: 1 + (shares-2)*9999/262142, clamped to [1, 10000]."""
    weight = 1 + ((shares - 2) * 9999) // 262142
    return max(1, min(10000, weight))


def milli_cpu_to_shares(milli: int) -> int:
    """Milli-CPU → cpu.shares: m*1024/1000 clamped to [2, 262144]; m <= 0 → 2."""
    if milli <= 0:
        return 2
    return max(2, min(262144, milli * 1024 // 1000))


def milli_cpu_to_quota(milli: int, period: int = CFS_BASE_PERIOD) -> int:
    """Milli-CPU → cfs quota (µs per `period`): <= 0 → -1 (unlimited); small positives clamp to 1000."""
    quota = milli * period // 1000
    if quota <= 0:
        return -1
    return max(quota, 1000)


_UNLIMITED_AS_MINUS_ONE = frozenset(
    {"cpu.cfs_quota_us", "memory.limit_in_bytes", "memory.min", "memory.low", "memory.high"}
)


def _int_or_max(text: str) -> int:
    """Parse a cgroup number where `max` (or anything >= the unlimited floor) means -1."""
    t = text.strip()
    if t == "max":
        return -1
    v = int(t)
    return -1 if v >= UNLIMITED_FLOOR else v


# -- registry ------------------------------------------------------------------------------------


def _r(
    name: str, subsystem: str, v1: str | None, v2: str | None, validate: Validator, **kw: object
) -> Resource:
    return Resource(name, subsystem, v1, v2, validate, **kw)  # type: ignore[arg-type]


_RESOURCES: tuple[Resource, ...] = (
    # cpu
    _r("cpu.shares", "cpu", "cpu.shares", "cpu.weight", int_range(2, 262144)),
    _r("cpu.cfs_quota_us", "cpu", "cpu.cfs_quota_us", "cpu.max", _quota, merge=Merge.LARGER),
    _r("cpu.cfs_period_us", "cpu", "cpu.cfs_period_us", "cpu.max", int_range(1000, 1_000_000)),
    _r(
        "cpu.cfs_burst_us",
        "cpu",
        "cpu.cfs_burst_us",
        "cpu.max.burst",
        int_range(0, 100_000_000),
        standard=False,
    ),
    _r("cpu.idle", "cpu", "cpu.idle", "cpu.idle", int_range(0, 1), standard=False),
    _r("cpu.bvt_warp_ns", "cpu", "cpu.bvt_warp_ns", "cpu.bvt_warp_ns", int_range(-1, 2), standard=False),
    # cpuset
    _r("cpuset.cpus", "cpuset", "cpuset.cpus", "cpuset.cpus", _cpuset, merge=Merge.LOOSER, numeric=False),
    _r("cpuset.mems", "cpuset", "cpuset.mems", "cpuset.mems", _cpuset, merge=Merge.LOOSER, numeric=False),
    # memory
    _r("memory.limit_in_bytes", "memory", "memory.limit_in_bytes", "memory.max", _limit, blocking=True),
    # -1 (or >= the unlimited floor) means "max" for the memory protections and limits
    _r("memory.min", "memory", "memory.min", "memory.min", _limit, merge=Merge.LARGER, standard=False),
    _r("memory.low", "memory", "memory.low", "memory.low", _limit, merge=Merge.LARGER, standard=False),
    _r(
        "memory.high",
        "memory",
        "memory.high",
        "memory.high",
        _limit,
        merge=Merge.LARGER,
        blocking=True,
        standard=False,
    ),
    _r(
        "memory.wmark_ratio",
        "memory",
        "memory.wmark_ratio",
        "memory.wmark_ratio",
        int_range(0, 100),
        standard=False,
    ),
    _r(
        "memory.wmark_scale_factor",
        "memory",
        "memory.wmark_scale_factor",
        "memory.wmark_scale_factor",
        int_range(1, 1000),
        standard=False,
    ),
    _r(
        "memory.wmark_min_adj",
        "memory",
        "memory.wmark_min_adj",
        "memory.wmark_min_adj",
        int_range(-25, 50),
        standard=False,
    ),
    _r("memory.priority", "memory", "memory.priority", "memory.priority", int_range(0, 12), standard=False),
    _r(
        "memory.use_priority_oom",
        "memory",
        "memory.use_priority_oom",
        "memory.use_priority_oom",
        int_range(0, 1),
        standard=False,
    ),
    _r("memory.oom.group", "memory", "memory.oom.group", "memory.oom.group", int_range(0, 1), standard=False),
    _r(
        "memory.pagecache_limit.enable",
        "memory",
        None,
        "memory.pagecache_limit.enable",
        int_range(0, 1),
        standard=False,
    ),
    _r(
        "memory.pagecache_limit.size",
        "memory",
        None,
        "memory.pagecache_limit.size",
        int_range(0, None),
        standard=False,
    ),
    _r(
        "memory.pagecache_limit.sync",
        "memory",
        None,
        "memory.pagecache_limit.sync",
        int_range(0, 1),
        standard=False,
    ),
    # blkio: v1 files; on v2 the throttles are io.max keys and the weight io.weight (project decision)
    *(
        _r(name, "blkio", name, "io.max", _device_value, numeric=False)
        for name in (
            "blkio.throttle.read_iops_device",
            "blkio.throttle.read_bps_device",
            "blkio.throttle.write_iops_device",
            "blkio.throttle.write_bps_device",
        )
    ),
    _r(
        "blkio.cost.weight",
        "blkio",
        "blkio.cost.weight",
        "io.weight",
        _device_weight,
        standard=False,
        numeric=False,
    ),
    _r("blkio.cost.qos", "blkio", "blkio.cost.qos", "io.cost.qos", _device_kv, numeric=False, root_only=True),
    _r(
        "blkio.cost.model",
        "blkio",
        "blkio.cost.model",
        "io.cost.model",
        _device_kv,
        numeric=False,
        root_only=True,
    ),
    # net_cls (v1 only)
    _r("net_cls.classid", "net_cls", "net_cls.classid", None, int_range(0, 0xFFFFFFFF)),
)

RESOURCES: Mapping[str, Resource] = MappingProxyType({r.name: r for r in _RESOURCES})


def get_resource(name: str) -> Resource:
    """The registered resource called `name` (CgroupError if unknown)."""
    try:
        return RESOURCES[name]
    except KeyError:
        raise CgroupError(f"unknown cgroup resource {name!r}") from None


def validate(resource: Resource, value: int | str) -> None:
    """Raise CgroupError when `value` is not valid for `resource`."""
    problem = resource.validate(value)
    if problem is not None:
        raise CgroupError(f"{resource.name}: invalid value: {problem}")


def render(resource: Resource, value: int | str, version: CgroupVersion, current: str | None = None) -> str:
    """Validate `value` and return the text to write on `version`.

    `current` is the file's present content; only `cpu.cfs_period_us` on v2 needs it (cpu.max holds
    "quota period", and the period is written together with the current quota).
    """
    validate(resource, value)
    if not resource.numeric:
        text = str(value).strip()
        if version is CgroupVersion.V2 and resource.name in IO_MAX_KEYS:
            dev, _, limit = text.partition(" ")
            return f"{dev} {IO_MAX_KEYS[resource.name]}={'max' if limit == '0' else limit}"
        return text
    v = _as_int(value)
    assert v is not None  # validated above
    name = resource.name
    unlimited = name in _UNLIMITED_AS_MINUS_ONE and (v == -1 or v >= UNLIMITED_FLOOR)
    if version is CgroupVersion.V1:
        # memory.limit_in_bytes and cfs quota take "-1"; the memory protections take a huge number
        if unlimited and name in ("memory.min", "memory.low", "memory.high"):
            return str(MAX_INT64)
        return str(v)
    if name == "cpu.shares":
        return str(shares_to_weight(v))
    if unlimited:
        return "max"
    if name == "cpu.cfs_period_us":
        quota = "max"
        if current:
            quota = current.split()[0]
        return f"{quota} {v}"
    return str(v)


def same_value(resource: Resource, version: CgroupVersion, current: str, rendered: str) -> bool:
    """Whether a file holding `current` already has the value `rendered` (semantic comparison)."""
    cur = current.strip()
    new = rendered.strip()
    if cur == new:
        return True
    if resource.name in DEVICE_DEFAULTS or resource.name in DEVICE_KV_RESOURCES:
        return _same_device_entry(resource.name, version, cur, new)
    try:
        if resource.name in ("cpuset.cpus", "cpuset.mems"):
            return parse_cpuset(cur) == parse_cpuset(new)
        if version is CgroupVersion.V2 and resource.name == "cpu.cfs_quota_us":
            return _int_or_max(cur.split()[0]) == _int_or_max(new.split()[0])
        if version is CgroupVersion.V2 and resource.name == "cpu.cfs_period_us":
            return cur.split()[1:] == new.split()[1:] and _int_or_max(cur.split()[0]) == _int_or_max(
                new.split()[0]
            )
        if resource.numeric:
            return _int_or_max(cur) == _int_or_max(new)
    except (ValueError, IndexError):
        return False
    return False


def parse_current(resource: Resource, version: CgroupVersion, text: str) -> int | str:
    """A file's content as a logical value: ints for numeric resources (-1 for unlimited/`max`).

    v2 `cpu.max` yields the quota or the period depending on the resource; v2 `cpu.weight` is returned as
    is (a weight, not shares: the conversion is not invertible).
    """
    t = text.strip()
    if not resource.numeric:
        return t
    if version is CgroupVersion.V2 and resource.name == "cpu.cfs_quota_us":
        return _int_or_max(t.split()[0])
    if version is CgroupVersion.V2 and resource.name == "cpu.cfs_period_us":
        return int(t.split()[1])
    return _int_or_max(t)


def merged_value(resource: Resource, current: int | str, new: int | str) -> int | str:
    """The looser of `current` and `new` for a mergeable resource (for the top-down pass)."""
    if resource.merge is Merge.LOOSER:
        return format_cpuset(parse_cpuset(str(current)) | parse_cpuset(str(new)))
    if resource.merge is Merge.LARGER:
        c, n = _as_int(current), _as_int(new)
        if c is None or n is None:
            return new
        if c == -1 or n == -1:
            return -1
        return max(c, n)
    return new
