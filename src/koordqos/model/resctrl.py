"""Resctrl math and formats (docs/reconcile.md, "Resctrl"; docs/behaviour-runtime-hooks.md, "Resctrl hook"):
pure, no I/O.

* `cat_l3_mask(cbm, start, end)`: the L3 way mask of a percent range of the cache ways;
* `mba_value(percent, vendor)`: the memory-bandwidth value (Intel: percent rounded up to 10; AMD: Gbps);
* `l3_line` / `mb_line`: schemata lines over the cache ids;
* `parse_schemata`: the cache ids and values of a `schemata` file;
* `PodResctrl`: the pod annotation `node.koordinator.sh/resctrl` (per-pod group `koordlet-<uid>`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from koordqos.errors import ModelError

VENDOR_INTEL = "GenuineIntel"
VENDOR_AMD = "AuthenticAMD"
# AMD MBA is in units of 1/8 GB/s; koordlet caps it at 25 GB/s × 8 × 0.8 and uses 2048 as "unlimited"
AMD_MBA_MAX = 160
AMD_MBA_UNLIMITED = "2048"

GROUP_LSR = "LSR"
GROUP_LS = "LS"
GROUP_BE = "BE"
CLASS_GROUPS = (GROUP_LSR, GROUP_LS, GROUP_BE)
POD_GROUP_PREFIX = "koordlet-"


def pod_group(uid: str) -> str:
    """The resctrl group (closid) of a pod with its own schemata."""
    return f"{POD_GROUP_PREFIX}{uid}"


def parse_cbm(text: str) -> int:
    """The hex L3 capacity bitmask (`info/L3/cbm_mask`, e.g. "7ff"); ValueError when empty or not hex."""
    t = text.strip().lower().removeprefix("0x")
    if not t:
        raise ValueError("empty cbm mask")
    return int(t, 16)


def cat_l3_mask(cbm: int, start: int, end: int) -> str:
    """The L3 mask of ways [start %, end %) of a contiguous cbm, hex without prefix (ValueError if invalid).

    ways = bit length of cbm; start way = ceil(ways×start/100), end way = ceil(ways×end/100).
    """
    if cbm <= 0 or cbm & (cbm + 1):
        raise ValueError(f"cbm {cbm:#x} is not a contiguous mask (2^k-1)")
    if start < 0 or end > 100 or end <= start:
        raise ValueError(f"invalid cat range start {start}% end {end}%")
    ways = cbm.bit_length()
    start_way = math.ceil(ways * start / 100)
    end_way = math.ceil(ways * end / 100)
    mask = (1 << end_way) - (1 << start_way)
    if mask <= 0:
        raise ValueError(f"cat range {start}%-{end}% selects no way of cbm {cbm:#x}")
    return f"{mask:x}"


def mba_value(percent: int | None, vendor: str) -> str | None:
    """The MB schemata value of `percent` (None when unset or outside [1, 100]: the line is skipped)."""
    if percent is None or not 1 <= percent <= 100:
        return None
    if vendor == VENDOR_AMD:
        if percent == 100:
            return AMD_MBA_UNLIMITED
        return str(AMD_MBA_MAX * percent // 100)
    return str(math.ceil(percent / 10) * 10)


def _line(kind: str, ids: Iterable[int], value: str) -> str:
    return f"{kind}:" + "".join(f"{i}={value};" for i in sorted(ids)) + "\n"


def l3_line(ids: Iterable[int], mask: str) -> str:
    """`L3:<id>=<mask>;…\\n` over the sorted cache ids."""
    return _line("L3", ids, mask)


def mb_line(ids: Iterable[int], value: str) -> str:
    """`MB:<id>=<value>;…\\n` over the sorted cache ids."""
    return _line("MB", ids, value)


def per_cache_line(kind: str, values: Mapping[int, str]) -> str:
    """A schemata line with a value per cache id."""
    return f"{kind}:" + "".join(f"{i}={values[i]};" for i in sorted(values)) + "\n"


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """`schemata` content → {"L3": {id: value}, "MB": {...}}; lines that do not parse are ignored."""
    out: dict[str, dict[int, str]] = {}
    for raw in text.splitlines():
        kind, sep, rest = raw.strip().partition(":")
        if not sep:
            continue
        values: dict[int, str] = {}
        for part in rest.split(";"):
            key, eq, value = part.strip().partition("=")
            if eq and key.strip().isdigit():
                values[int(key)] = value.strip()
        out[kind.strip()] = values
    return out


def same_schemata(current: str, wanted: str) -> bool:
    """Whether `current` already holds every value of `wanted` (the kernel pads masks, e.g. "03c" == "3c")."""
    have = parse_schemata(current)
    for kind, values in parse_schemata(wanted).items():
        cur = have.get(kind, {})
        for cache_id, value in values.items():
            got = cur.get(cache_id)
            if got is None:
                return False
            try:
                if int(got, 16 if kind.startswith("L3") else 10) != int(
                    value, 16 if kind.startswith("L3") else 10
                ):
                    return False
            except ValueError:
                if got != value:
                    return False
    return True


# -- the pod annotation `node.koordinator.sh/resctrl` -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheRange:
    """An L3 way range (percent) for one cache id, or for every cache when `cache_id` is None."""

    start: int
    end: int
    cache_id: int | None = None


@dataclass(frozen=True, slots=True)
class CachePercent:
    """A memory bandwidth percent for one cache id, or for every cache when `cache_id` is None."""

    percent: int
    cache_id: int | None = None


@dataclass(frozen=True, slots=True)
class PodResctrl:
    """`{"llc": {"schemata": {"range": [s, e]}, "schemataPerCache": [...]}, "mb": {...}}`."""

    llc: CacheRange | None = None
    llc_per_cache: tuple[CacheRange, ...] = ()
    mb: CachePercent | None = None
    mb_per_cache: tuple[CachePercent, ...] = ()

    def schemata(self, cbm: int, ids: Sequence[int], vendor: str) -> str:
        """The group's schemata: the valid L3 line and the valid MB line (invalid parts are left out)."""
        out = ""
        l3: dict[int, str] = {}
        if self.llc is not None:
            try:
                mask = cat_l3_mask(cbm, self.llc.start, self.llc.end)
                l3 = dict.fromkeys(ids, mask)
            except ValueError:
                l3 = {}
        for r in self.llc_per_cache:
            if r.cache_id in ids:
                try:
                    l3[r.cache_id] = cat_l3_mask(cbm, r.start, r.end)  # type: ignore[index]
                except ValueError:
                    continue
        if l3:
            out += per_cache_line("L3", l3)
        mb: dict[int, str] = {}
        if self.mb is not None:
            value = mba_value(self.mb.percent, vendor)
            if value is not None:
                mb = dict.fromkeys(ids, value)
        for p in self.mb_per_cache:
            value = mba_value(p.percent, vendor)
            if p.cache_id in ids and value is not None:
                mb[p.cache_id] = value  # type: ignore[index]
        if mb:
            out += per_cache_line("MB", mb)
        return out


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{where}: expected an integer (got {value!r})")
    return value


def _range(doc: object, where: str) -> tuple[int, int]:
    if not isinstance(doc, list) or len(doc) != 2:
        raise ModelError(f"{where}: expected [start, end]")
    return _int(doc[0], f"{where}[0]"), _int(doc[1], f"{where}[1]")


def parse_pod_resctrl(raw: str) -> PodResctrl:
    """Parse the annotation (ModelError naming the bad field)."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ModelError(f"invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelError("expected a JSON object")
    llc = llc_per = mb = mb_per = None
    llc_doc = doc.get("llc") or {}
    mb_doc = doc.get("mb") or {}
    if not isinstance(llc_doc, dict) or not isinstance(mb_doc, dict):
        raise ModelError("llc and mb must be objects")
    sch = llc_doc.get("schemata")
    if isinstance(sch, dict) and sch.get("range") is not None:
        s, e = _range(sch["range"], "llc.schemata.range")
        llc = CacheRange(s, e)
    per: list[CacheRange] = []
    for i, item in enumerate(llc_doc.get("schemataPerCache") or ()):
        if not isinstance(item, dict):
            raise ModelError(f"llc.schemataPerCache[{i}]: expected an object")
        s, e = _range(item.get("range"), f"llc.schemataPerCache[{i}].range")
        per.append(CacheRange(s, e, _int(item.get("cacheID"), f"llc.schemataPerCache[{i}].cacheID")))
    llc_per = tuple(per)
    msch = mb_doc.get("schemata")
    if isinstance(msch, dict) and msch.get("percent") is not None:
        mb = CachePercent(_int(msch["percent"], "mb.schemata.percent"))
    mper: list[CachePercent] = []
    for i, item in enumerate(mb_doc.get("schemataPerCache") or ()):
        if not isinstance(item, dict):
            raise ModelError(f"mb.schemataPerCache[{i}]: expected an object")
        mper.append(
            CachePercent(
                _int(item.get("percent"), f"mb.schemataPerCache[{i}].percent"),
                _int(item.get("cacheID"), f"mb.schemataPerCache[{i}].cacheID"),
            )
        )
    mb_per = tuple(mper)
    return PodResctrl(llc, llc_per, mb, mb_per)
