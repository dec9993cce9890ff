"""The one NodeSLO validator: what `config validate` reports is what the agent refuses to apply.

`validate_nodeslo(doc, last)` checks a NodeSLO object (or a bare spec) as Koordinator's CRD would:

* the object: `apiVersion: slo.koordinator.sh/v1alpha1` and `kind: NodeSLO` when present; anything else, or
  koord-manager's `slo-controller-config` ConfigMap, raises `NotANodeSLO` (nothing of it is used);
* every field: its JSON type (strict, as Go's decoding: `"65"` is not an integer), its range (the
  `minimum` / `maximum` on the model fields: percent fields 0-100 and the CPU QoS values), a 64-bit integer,
  and `catRangeStartPercent` below `catRangeEndPercent` in each class.

A field that fails keeps its value of `last` (the previous verdict: the last valid value) or koordlet's
default, and the rest of the object applies; each failure is a `FieldProblem` (path, value, rule) in the
verdict. A "field" here is a leaf of the models: a scalar, a free-form map or a whole list (lists replace in
the overlay, so an invalid list item keeps the last valid list).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from koordqos.errors import ModelError
from koordqos.model.lint import lint, model_of
from koordqos.model.nodeslo import (
    DEFAULT_SPEC,
    MERGED_KEYS,
    NodeSLO,
    deep_overlay,
    merge_spec,
    object_metadata,
    replace_disabled,
)
from koordqos.model.wirevalue import FieldProblem, short

API_VERSION: Final = "slo.koordinator.sh/v1alpha1"
KIND: Final = "NodeSLO"
#: data keys of koord-manager's `slo-controller-config` ConfigMap (koordinator-system)
SLO_CONTROLLER_CONFIG_KEYS: Final = frozenset(
    {
        "colocation-config",
        "resource-threshold-config",
        "resource-qos-config",
        "cpu-burst-config",
        "system-config",
        "host-application-config",
        "cpu-normalization-config",
        "resource-amplification-config",
    }
)
SLO_CONTROLLER_CONFIG_HINT: Final = (
    "this is koord-manager's slo-controller-config ConfigMap (the cluster-wide settings it renders every "
    "node's NodeSLO from), not a NodeSLO: pass a node's NodeSLO instead (kubectl get nodeslo <node> -o yaml)"
)
_METADATA_FIELDS = frozenset({"name", "resource_version", "generation"})
_MAX_ROUNDS = 16  # check → revert rounds; each reverts at least one field, real documents need one or two

Path = tuple[str | int, ...]
#: problems found in one check, each with the fields (one or two) it reverts
Found = list[tuple[tuple[Path, ...], "FieldProblem"]]


class NotANodeSLO(ModelError):
    """The document is not a NodeSLO at all (wrong kind or apiVersion, a ConfigMap, no object)."""


@dataclass(frozen=True, slots=True)
class ValidatedNodeSLO:
    """The NodeSLO to apply (merged with the defaults), the fields rejected on the way, and the corrected
    overlay before the None templates: the last valid values the next document falls back to."""

    slo: NodeSLO
    problems: tuple[FieldProblem, ...]
    overlay: Mapping[str, Any]


def _is_slo_controller_config(doc: Mapping[str, Any]) -> bool:
    data = doc.get("data")
    keys = SLO_CONTROLLER_CONFIG_KEYS.intersection(data) if isinstance(data, Mapping) else set()
    if doc.get("kind") == "ConfigMap":
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return name == "slo-controller-config" or bool(keys)
    return "kind" not in doc and bool(keys)


def _envelope(doc: Any) -> tuple[Mapping[str, Any], Mapping[str, Any] | None, str]:
    """(spec, metadata, path prefix) of a NodeSLO object or bare spec; NotANodeSLO when it is neither."""
    if not isinstance(doc, Mapping):
        raise NotANodeSLO(f"not a NodeSLO: wrong type: {short(doc)} (valid: an object)")
    if _is_slo_controller_config(doc):
        raise NotANodeSLO(SLO_CONTROLLER_CONFIG_HINT)
    kind, api = doc.get("kind"), doc.get("apiVersion")
    if "kind" in doc and kind != KIND:
        raise NotANodeSLO(f'kind: not a NodeSLO: {short(kind)} (valid: "{KIND}", apiVersion "{API_VERSION}")')
    if "apiVersion" in doc and api != API_VERSION:
        raise NotANodeSLO(f'apiVersion: not a NodeSLO\'s: {short(api)} (valid: "{API_VERSION}")')
    if "kind" not in doc and "spec" not in doc:
        return doc, None, ""
    spec = doc.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise NotANodeSLO(f"spec: wrong type: {short(spec)} (valid: an object)")
    meta = doc.get("metadata")
    return spec, meta if isinstance(meta, Mapping) else None, "spec."


@lru_cache(maxsize=1)
def _default_overlay() -> Mapping[str, Any]:
    """koordlet's defaults as an overlay (read only: reverts copy from it)."""
    return merge_spec({})


def _dotted(prefix: str, parts: Path) -> str:
    out = prefix.rstrip(".")
    for part in parts:
        out = f"{out}[{part}]" if isinstance(part, int) else f"{out}.{part}" if out else str(part)
    return out or "spec"


_MISSING = object()


def _lookup(doc: Any, parts: Path) -> Any:
    for part in parts:
        in_map = isinstance(part, str) and isinstance(doc, Mapping) and part in doc
        in_list = isinstance(part, int) and isinstance(doc, list | tuple) and 0 <= part < len(doc)
        if not (in_map or in_list):
            return _MISSING
        doc = doc[part]
    return doc


def _resolve(doc: Any, loc: Sequence[str | int], missing: bool) -> Path:
    """The document path of an error location: the keys that exist (the rest are union member tags); a
    missing required field keeps its name."""
    parts: list[str | int] = []
    for i, part in enumerate(loc):
        if _lookup(doc, (*parts, part)) is not _MISSING:
            parts.append(part)
            continue
        if missing and i == len(loc) - 1 and isinstance(part, str):
            parts.append(part)
        break
    return tuple(parts)


def _field(model: type[BaseModel], key: str) -> FieldInfo | None:
    for name, info in model.model_fields.items():
        if key in (info.alias, name):
            return info
    return None


def _unit(parts: Path) -> Path:
    """The field a problem at `parts` reverts: the path down to a model leaf, a free-form map or a list."""
    model: type[BaseModel] | None = NodeSLO
    unit: list[str | int] = []
    for part in parts:
        if model is None or not isinstance(part, str):
            break
        unit.append(part)
        info = _field(model, part)
        if info is None:
            break
        sub, is_seq = model_of(info.annotation)
        model = None if is_seq else sub
    return tuple(unit)


_RULES = {
    "bool_type": "true or false",
    "int_type": "an integer",
    "string_type": "a string",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dict_type": "an object",
    "tuple_type": "a list",
    "list_type": "a list",
    "iterable_type": "a list",
    "missing": "required",
}


def _type_problems(merged: dict[str, Any], prefix: str) -> Found:
    try:
        NodeSLO.model_validate(merged)
    except ValidationError as exc:
        by_path: dict[Path, list[Any]] = {}
        for err in exc.errors(include_url=False):
            missing = err["type"] == "missing"
            by_path.setdefault(_resolve(merged, err["loc"], missing), []).append(err)
        out: Found = []
        for parts, errs in by_path.items():
            kinds = {e["type"] for e in errs}
            rules: list[str] = []
            for e in errs:
                if e["type"] == "literal_error":
                    rule = "one of " + str((e.get("ctx") or {}).get("expected", "")).replace("'", '"')
                else:
                    rule = _RULES.get(e["type"], "a value of the field's type")
                if rule not in rules:
                    rules.append(rule)
            what = (
                "missing"
                if "missing" in kinds
                else "unknown value"
                if "literal_error" in kinds
                else "wrong type"
            )
            value = "" if what == "missing" else short(_lookup(merged, parts))
            problem = FieldProblem(_dotted(prefix, parts), what, value, " or ".join(rules))
            out.append(((_unit(parts),), problem))
        return out
    return []


def _range_problems(merged: dict[str, Any], prefix: str) -> Found:
    out: Found = []
    for found in lint(NodeSLO, merged, exclude=_METADATA_FIELDS):
        if found.unknown or not found.valid:
            continue
        value = short(_lookup(merged, found.parts))
        out.append(
            (
                (_unit(found.parts),),
                FieldProblem(_dotted(prefix, found.parts), "out of range", value, found.valid),
            )
        )
    return out


def _percent(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 100
    return value if ok else None


def _cat_range_problems(merged: dict[str, Any], prefix: str) -> Found:
    """catRangeStartPercent must be below catRangeEndPercent (an empty range has no cache ways)."""
    out: Found = []
    classes = merged.get("resourceQOSStrategy")
    if not isinstance(classes, Mapping):
        return out
    for cls, conf in classes.items():
        resctrl = conf.get("resctrlQOS") if isinstance(conf, Mapping) else None
        if not isinstance(resctrl, Mapping):
            continue
        start, end = (
            _percent(resctrl.get("catRangeStartPercent")),
            _percent(resctrl.get("catRangeEndPercent")),
        )
        if start is not None and end is not None and start >= end:
            base: Path = ("resourceQOSStrategy", cls, "resctrlQOS")
            problem = FieldProblem(
                _dotted(prefix, (*base, "catRangeStartPercent")),
                "out of range",
                short(start),
                f"below catRangeEndPercent ({end})",
            )
            out.append((((*base, "catRangeStartPercent"), (*base, "catRangeEndPercent")), problem))
    return out


def _revert(merged: dict[str, Any], unit: Path, fallback: Mapping[str, Any]) -> bool:
    """Put the fallback's value of `unit` in place (or remove the key: the default); False if nothing
    changed."""
    if not unit:
        return False
    parent = _lookup(merged, unit[:-1])
    key = unit[-1]
    if not isinstance(parent, dict) or not isinstance(key, str):
        return False
    before = _lookup(fallback, unit)
    if before is _MISSING:
        return parent.pop(key, _MISSING) is not _MISSING
    if key in parent and _identical(parent[key], before):
        return False
    parent[key] = copy.deepcopy(before)
    return True


def _identical(a: Any, b: Any) -> bool:
    """Equal as JSON values of the same types: `0.0`, `-0.0` and `false` are not `0` (Python's == says they
    are, and a wrong-typed value equal to its default was never reverted: the whole NodeSLO fell back)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _merged(
    spec: Mapping[str, Any], fallback: Mapping[str, Any], prefix: str
) -> tuple[dict[str, Any], list[FieldProblem]]:
    """The spec overlaid on the defaults; a strategy that is not an object keeps its fallback."""
    problems = []
    merged: dict[str, Any] = {}
    for key in MERGED_KEYS:
        value = spec.get(key)
        if value is not None and not isinstance(value, Mapping):
            problems.append(FieldProblem(_dotted(prefix, (key,)), "wrong type", short(value), "an object"))
            merged[key] = copy.deepcopy(fallback[key])
        else:
            merged[key] = deep_overlay(DEFAULT_SPEC[key], value)
    for key, value in spec.items():
        if key not in MERGED_KEYS and key not in ("kind", "apiVersion", "metadata"):
            merged[str(key)] = copy.deepcopy(value)
    return merged, problems


def validate_nodeslo(doc: Any, last: ValidatedNodeSLO | None = None) -> ValidatedNodeSLO:
    """Validate `doc` field by field (module docstring); NotANodeSLO when it is not a NodeSLO at all."""
    spec, meta, prefix = _envelope(doc)
    fallback = last.overlay if last is not None else _default_overlay()
    merged, first = _merged(spec, fallback, prefix)
    problems: dict[str, FieldProblem] = {p.path: p for p in first}
    reverted: set[Path] = {(key,) for key in MERGED_KEYS if not isinstance(spec.get(key), Mapping | None)}
    for _ in range(_MAX_ROUNDS):
        found = _type_problems(merged, prefix) or _range_problems(merged, prefix) + _cat_range_problems(
            merged, prefix
        )
        if not found:
            break
        changed = False
        for units, problem in found:
            # a pair broken only by a partner already reverted (its own value invalid) is not another problem
            if not any(unit[: len(r)] == r for unit in units for r in reverted):
                problems.setdefault(problem.path, problem)
            for unit in units:
                changed = _revert(merged, unit, fallback) or changed
                reverted.add(unit)
        if not changed:
            merged = copy.deepcopy(dict(fallback))  # cannot be corrected field by field: all last valid
            break
    else:
        merged = copy.deepcopy(dict(fallback))
    overlay = copy.deepcopy(merged)
    replace_disabled(merged["resourceQOSStrategy"])
    merged.update(object_metadata(meta))
    return ValidatedNodeSLO(NodeSLO.model_validate(merged), tuple(problems.values()), overlay)
