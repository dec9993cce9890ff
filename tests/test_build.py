"""The build's identity (interpreted or compiled) and the compiled build's tool, tools/compile.py.

`nox -s compiled` runs the NRI and hook tests with the mypyc build first on the path and
KOORDQOS_EXPECT_COMPILED=1: then every module of the hot path must come from its C extension, so that
session cannot pass on interpreted code by mistake.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from koordqos.build import compiled_modules, describe

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("koordqos_compile_tool", ROOT / "tools" / "compile.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_compiled_modules_are_the_extensions_beside_a_source(tmp_path: Path) -> None:
    pkg = tmp_path / "koordqos"
    (pkg / "nri").mkdir(parents=True)
    for name in ("__init__.py", "nri/__init__.py", "nri/ttrpc.py", "nri/mux.py", "agent.py"):
        (pkg / name).write_text("")
    (pkg / "nri" / f"ttrpc{SUFFIX}").write_bytes(b"")
    (pkg / f"agent{SUFFIX}").write_bytes(b"")
    (pkg / "nri" / f"orphan{SUFFIX}").write_bytes(b"")  # no source beside it: not one of ours
    (pkg / "nri" / "notes.so.txt").write_text("")
    assert compiled_modules(pkg) == ["koordqos.agent", "koordqos.nri.ttrpc"]
    assert describe(pkg) == "compiled (2 modules)"
    (pkg / f"agent{SUFFIX}").unlink()
    (pkg / "nri" / f"ttrpc{SUFFIX}").unlink()
    assert describe(pkg) == "interpreted"


def test_the_tool_compiles_existing_modules_with_the_projects_mypy_settings() -> None:
    tool = _tool()
    assert tool.HOT_PATH, "nothing to compile"
    for rel in tool.HOT_PATH:
        assert (ROOT / "src" / rel).is_file(), rel
    # mixins and a generic frozen dataclass do not compile (docs/performance-history.md, "The compiled build")
    assert "koordqos/nri/calls.py" not in tool.HOT_PATH
    assert "koordqos/hooks/framework.py" not in tool.HOT_PATH
    ini = tool.mypy_ini(ROOT / "pyproject.toml")
    assert ini.startswith("[mypy]\n")
    assert "strict = true" in ini
    assert "plugins = pydantic.mypy" in ini
    assert "files" not in ini
    assert "mypy_path" not in ini
    assert "[mypy-koordqos.nri.api.*,koordqos.proxy.api.*]\nignore_errors = true" in ini


def test_the_hot_path_runs_the_build_this_session_expects() -> None:
    """Compiled under `nox -s compiled` (KOORDQOS_EXPECT_COMPILED=1), interpreted everywhere else: the
    source tree never holds a stray extension that would shadow the code under test."""
    expect_compiled = os.environ.get("KOORDQOS_EXPECT_COMPILED") == "1"
    for rel in _tool().HOT_PATH:
        name = rel.removesuffix(".py").replace("/", ".")
        origin = importlib.import_module(name).__file__ or ""
        assert origin.endswith(SUFFIX) is expect_compiled, (name, origin)
    kind = describe()
    assert kind.startswith("compiled") if expect_compiled else kind == "interpreted", kind
