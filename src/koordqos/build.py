"""Which of the package's modules this installation runs compiled (the mypyc build, `tools/compile.py`)."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def compiled_modules(package: Path = _PACKAGE) -> list[str]:
    """The dotted names of the modules with a C extension beside their source: Python imports an extension
    before the `.py` of the same name, so these run compiled. Empty for the interpreted build."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    names = []
    for path in package.rglob("*.so"):
        stem = path.name.split(".")[0]
        if not path.name.endswith(suffixes) or not path.with_name(stem + ".py").exists():
            continue
        rel = path.relative_to(package.parent).with_name(stem)
        names.append(".".join(rel.parts))
    return sorted(names)


def describe(package: Path = _PACKAGE) -> str:
    """One word for logs and `koordqos version`: interpreted, or compiled with its module count."""
    n = len(compiled_modules(package))
    return f"compiled ({n} modules)" if n else "interpreted"
