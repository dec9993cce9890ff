"""The product wheel: the package and the runtime tooling the demo needs, no test tooling (#38 item 3).

The fake API server, the fuzzer, the heap tracer, the Go-peer builder and the tests' cluster-mode additions to
the agent-subprocess helper live in `tests/support/`, which `pip install .` does not ship; nothing in the
product may import them. (The helper itself, `koordqos.testing.agentrunner`, ships: the demo starts the agent
with it.)
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from hatchling.builders.wheel import WheelBuilder

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "koordqos"
TEST_TOOLING = ("fake_apiserver", "fake_objects", "fuzz", "heaptrace", "gopeer", "agentproc")


def test_the_wheel_ships_the_package_and_no_test_tooling(tmp_path: Path) -> None:
    (wheel,) = WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"])
    names = zipfile.ZipFile(wheel).namelist()
    assert "koordqos/agent.py" in names
    assert "koordqos/testing/mock_nri/runtime.py" in names  # the demo's mock runtime stays
    assert not [n for n in names if n.startswith("tests/")]
    shipped_testing = {Path(n).stem for n in names if n.startswith("koordqos/testing/")}
    assert not shipped_testing & set(TEST_TOOLING)


def test_no_product_module_imports_the_test_tooling() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}: {m}" for m in modules if m.split(".")[0] == "tests"]
    assert offenders == []
