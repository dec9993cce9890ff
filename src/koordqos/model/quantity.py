"""Kubernetes resource quantities: parse `500m`, `2`, `4Gi`, `1e3` into milli-units or bytes."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from koordqos.errors import ModelError

_SUFFIX = {
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_MAX = Decimal(2**63)  # Kubernetes quantities are int64 (milli-values of cpu even less)
_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into a Decimal of base units."""
    if isinstance(value, bool):
        raise ModelError(f"invalid quantity {value!r}")
    if isinstance(value, int | float):
        num = Decimal(str(value))
        if not num.is_finite() or abs(num) > _MAX:
            raise ModelError(f"quantity out of range {value!r}")
        return num
    m = _RE.match(value.strip())
    if not m:
        raise ModelError(f"invalid quantity {value!r}")
    try:
        result = Decimal(m.group(1)) * _SUFFIX[m.group(2) or ""]
    except (InvalidOperation, ArithmeticError):
        raise ModelError(f"invalid quantity {value!r}") from None
    if not result.is_finite() or abs(result) > _MAX:
        raise ModelError(f"quantity out of range {value!r}")
    return result


def to_milli(value: str | int | float) -> int:
    """Quantity → milli-units, rounded up (as Kubernetes does for CPU)."""
    return math.ceil(parse_quantity(value) * 1000)


def to_int(value: str | int | float) -> int:
    """Quantity → whole base units (bytes), rounded up."""
    return math.ceil(parse_quantity(value))


#: Deprecated extended-resource names and the `kubernetes.io/` names they stand for.
DEPRECATED_RESOURCE_NAMES = {
    "koordinator.sh/batch-cpu": "kubernetes.io/batch-cpu",
    "koordinator.sh/batch-memory": "kubernetes.io/batch-memory",
}
#: Resources whose quantity is counted in milli-units (only the standard CPU; batch/mid CPU are already
#: integer milli-cores on the wire, e.g. `kubernetes.io/batch-cpu: 2000` = 2 cores).
MILLI_RESOURCES = frozenset({"cpu"})


#: the longest resource name and quantity text whose value is memoised (real names are short:
#: "kubernetes.io/batch-cpu"); longer ones, hostile pod data mostly, are parsed every time
MEMO_NAME_CHARS = 128
MEMO_QUANTITY_CHARS = 64


def resource_value(name: str, value: str | int | float) -> int:
    """One resource quantity in the agent's unit: `cpu` → milli-cores, everything else → whole units
    (bytes for memory, milli-cores for batch/mid cpu); ModelError if malformed."""
    if len(name) > MEMO_NAME_CHARS or (type(value) is str and len(value) > MEMO_QUANTITY_CHARS):
        return _resource_value.__wrapped__(name, value)
    return _resource_value(name, value)


@lru_cache(maxsize=4096)  # of names and quantities of at most 192 characters: ~1.5 MiB at most
def _resource_value(name: str, value: str | int | float) -> int:
    if name in MILLI_RESOURCES:
        return to_milli(value)
    return to_int(value)


#: the largest value of a resource in the agent's unit (Kubernetes keeps quantities, milli-values included, in
#: int64; a larger one overflows in koordlet and the API server refuses it)
MAX_RESOURCE_VALUE = (1 << 63) - 1


def parse_resource_list(raw: Mapping[str, Any]) -> tuple[dict[str, int], list[str]]:
    """A ResourceList dict → ({name: value}, [errors]); deprecated names mapped, malformed ones left out
    (a negative quantity, which the API server's validation refuses in requests, limits, capacity and
    allocatable, or one past int64 in the agent's unit, is malformed too)."""
    out: dict[str, int] = {}
    errors: list[str] = []
    if not isinstance(raw, Mapping):
        return out, [f"expected a resource map (got {type(raw).__name__})"]
    for name, value in raw.items():
        canonical = DEPRECATED_RESOURCE_NAMES.get(name, name)
        if canonical != name and canonical in raw:
            continue  # the current name wins over the deprecated one
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            errors.append(f"{name}: invalid quantity {value!r}")
            continue
        try:
            parsed = resource_value(canonical, value)
        except ModelError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if parsed < 0:
            errors.append(f"{name}: negative quantity {value!r}")
        elif parsed > MAX_RESOURCE_VALUE:
            errors.append(f"{name}: quantity out of range {value!r}")
        else:
            out[canonical] = parsed
    return out, errors
