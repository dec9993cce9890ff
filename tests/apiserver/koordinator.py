"""The real Koordinator components (koord-manager, koordlet) at KOORDINATOR_VERSION, built once and cached.

`go install` refuses a module with replace directives, so they are built from a small module of our own under
`~/.cache/koordqos-e2e/koordinator-<version>/mod`: it requires Koordinator at the release and repeats the
`replace` block of its go.mod (fetched from the Go module proxy). koordlet needs cgo and libpfm4's headers
(Debian: libpfm4-dev). Usage: `python -m tests.apiserver.koordinator [koord-manager] [koordlet]`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .controlplane import (
    BUILD_TIMEOUT_SECONDS,
    CACHE_ROOT,
    KOORDINATOR_MODULE,
    KOORDINATOR_VERSION,
    Unavailable,
    koordinator_module_dir,
)

COMPONENTS = ("koord-manager", "koordlet")


def home(version: str = KOORDINATOR_VERSION) -> Path:
    return CACHE_ROOT / f"koordinator-{version}"


def binary(name: str, version: str = KOORDINATOR_VERSION) -> Path:
    """Where the built component is (it may not exist yet)."""
    return home(version) / "bin" / name


def build_module(version: str = KOORDINATOR_VERSION) -> Path:
    """The build module: go.mod requiring Koordinator with its replace block, a tools.go importing the
    commands (so `go mod tidy` resolves their dependencies)."""
    mod = home(version) / "mod"
    mod.mkdir(parents=True, exist_ok=True)
    upstream = (koordinator_module_dir(version) / "go.mod").read_text()
    found = re.search(r"^replace \($.*?^\)$", upstream, re.MULTILINE | re.DOTALL)
    go_line = re.search(r"^go (\S+)$", upstream, re.MULTILINE)
    text = (
        "module koordqos.local/koordbuild\n\n"
        f"go {go_line.group(1) if go_line else '1.25.0'}\n\n"
        f"require {KOORDINATOR_MODULE} {version}\n\n" + (found.group(0) + "\n" if found else "")
    )
    stamp = mod / "go.mod.in"  # what go.mod was made from (go mod tidy rewrites go.mod itself)
    if not stamp.exists() or stamp.read_text() != text:
        (mod / "go.mod").write_text(text)
        stamp.write_text(text)
        (mod / "go.sum").unlink(missing_ok=True)
    imports = "\n".join(f'\t_ "{KOORDINATOR_MODULE}/cmd/{c}"' for c in COMPONENTS)
    (mod / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
    return mod


def _go(mod: Path, *args: str, timeout: float) -> None:
    go = shutil.which("go")
    if go is None:
        raise Unavailable("no go toolchain to build Koordinator with")
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    out = subprocess.run(
        [go, *args], check=False, cwd=mod, env=env, capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-8:])
        raise Unavailable(f"go {' '.join(args)} failed:\n{tail}")


def build(name: str, version: str = KOORDINATOR_VERSION) -> tuple[Path, float | None]:
    """The component's binary, built if missing; (path, build seconds or None when cached)."""
    path = binary(name, version)
    if path.is_file():
        return path, None
    began = time.monotonic()
    mod = build_module(version)
    if not (mod / "go.sum").exists():
        _go(mod, "mod", "tidy", timeout=BUILD_TIMEOUT_SECONDS)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    _go(mod, "build", "-o", str(partial), f"{KOORDINATOR_MODULE}/cmd/{name}", timeout=BUILD_TIMEOUT_SECONDS)
    partial.rename(path)
    return path, time.monotonic() - began


def main(argv: list[str]) -> int:
    names = argv or list(COMPONENTS)
    for name in names:
        try:
            path, seconds = build(name)
        except (Unavailable, subprocess.TimeoutExpired) as exc:
            print(f"e2e-koordinator: {name}: {exc}", file=sys.stderr)
            return 1
        how = "cached" if seconds is None else f"built in {seconds:.0f}s (load {os.getloadavg()[0]:.1f})"
        print(f"e2e-koordinator: {name} {KOORDINATOR_VERSION}: {how}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
