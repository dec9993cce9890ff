"""Kubernetes resource quantities: parse `500m`, `2`, `4Gi`, `1e3` into milli-units or bytes."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from koordqos.errors import ModelError

_SUFFIX = {
    "Ki": Decimal(1024), "Mi": Decimal(1024**2), "Gi": Decimal(1024**3), "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5), "Ei": Decimal(1024**6),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
}
_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into a Decimal of base units."""
    if isinstance(value, bool):
        raise ModelError(f"invalid quantity {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    m = _RE.match(value.strip())
    if not m:
        raise ModelError(f"invalid quantity {value!r}")
    try:
        num = Decimal(m.group(1))
    except InvalidOperation:
        raise ModelError(f"invalid quantity {value!r}") from None
    return num * _SUFFIX[m.group(2) or ""]


def to_milli(value: str | int | float) -> int:
    """Quantity → milli-units, rounded up (as Kubernetes does for CPU)."""
    return math.ceil(parse_quantity(value) * 1000)


def to_int(value: str | int | float) -> int:
    """Quantity → whole base units (bytes), rounded up."""
    return math.ceil(parse_quantity(value))
