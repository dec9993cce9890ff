"""Checks of a raw JSON document against pydantic models beyond what parsing enforces.

* Unknown keys. The NodeSLO models ignore them, as Go's `json.Unmarshal` does (a cluster may carry newer CRD
  fields), so a typo like `cpuSupressThresholdPercent` silently means "not set". Each key no field takes is
  reported with a `difflib` suggestion among the wire names at that level (aliases and Python names are both
  accepted keys).
* Ranges: integer fields carrying JSON-schema `minimum` / `maximum` in `json_schema_extra`, and every integer
  within int64 (Go's `int64`: a larger JSON number fails koordlet's decoding).

`lint(model, doc)` walks the document along the model's fields; fields typed as free-form maps
(`dict[str, Any]`) are not descended into.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from koordqos.model.wirevalue import INT64_MAX, INT64_MIN


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem at a dotted path (`spec.resourceUsedThresholdWithBE.enabel`)."""

    path: str
    problem: str  # "unknown field" or "out of range: ..."
    suggestion: str | None = None  # unknown field: the closest known wire name at that level
    parts: tuple[str | int, ...] = ()  # the path as keys and list indices (below the `lint` path prefix)
    valid: str = ""  # out of range: the rule (`[0, 100]`, `>= 0`, `a 64-bit integer`)

    @property
    def unknown(self) -> bool:
        """An unknown key (as opposed to a bad value)."""
        return self.problem == UNKNOWN

    def describe(self) -> str:
        """`<path>: <problem> (did you mean "<suggestion>"?)`."""
        hint = f' (did you mean "{self.suggestion}"?)' if self.suggestion else ""
        return f"{self.path}: {self.problem}{hint}"


UNKNOWN = "unknown field"


def closest(key: str, names: list[str] | tuple[str, ...]) -> str | None:
    """The known name most like `key` (difflib ratio >= 0.6), None when none is close."""
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else None


def model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model class, is a sequence) behind `M`, `M | None`, `tuple[M, ...]`, `list[M]`; (None, _) else."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            model, seq = model_of(arg)
            if model is not None:
                return model, seq
        return None, False
    if origin in (tuple, list):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        if len(args) == 1:
            model, _ = model_of(args[0])
            return model, model is not None
        return None, False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def range_rule(info: FieldInfo, value: Any) -> str | None:
    """The rule an integer `value` of this field breaks (`[0, 100]`, `>= 0`, `a 64-bit integer`), or None."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not INT64_MIN <= value <= INT64_MAX:
        return "a 64-bit integer"
    extra = info.json_schema_extra
    if not isinstance(extra, dict):
        return None
    low, high = extra.get("minimum"), extra.get("maximum")
    if (isinstance(low, int) and value < low) or (isinstance(high, int) and value > high):
        return f"[{low}, {high}]" if high is not None else f">= {low}" if low is not None else f"<= {high}"
    return None


def lint(
    model: type[BaseModel],
    doc: Any,
    path: str = "",
    exclude: frozenset[str] = frozenset(),
    parts: tuple[str | int, ...] = (),
) -> list[Finding]:
    """Unknown keys and out-of-range values in `doc` (recursively); [] when `doc` is not a mapping.

    `exclude`: fields of `model` itself that are not document keys (e.g. object metadata kept on the model).
    """
    if not isinstance(doc, Mapping):
        return []
    fields: dict[str, FieldInfo] = {}
    wire: list[str] = []
    for name, info in model.model_fields.items():
        if name in exclude:
            continue
        fields[name] = info
        if info.alias:
            fields[info.alias] = info
        wire.append(info.alias or name)
    out: list[Finding] = []
    for key, value in doc.items():
        where = f"{path}.{key}" if path else str(key)
        at = (*parts, key)
        field = fields.get(key)
        if field is None:
            out.append(Finding(where, UNKNOWN, closest(str(key), wire), at))
            continue
        rule = range_rule(field, value)
        if rule:
            out.append(Finding(where, f"out of range: {value} (valid: {rule})", None, at, rule))
        sub, is_seq = model_of(field.annotation)
        if sub is None:
            continue
        if is_seq:
            if isinstance(value, list | tuple):
                for i, item in enumerate(value):
                    out.extend(lint(sub, item, f"{where}[{i}]", parts=(*at, i)))
        else:
            out.extend(lint(sub, value, where, parts=at))
    return out
