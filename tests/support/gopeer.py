"""The real NRI runtime code as a test peer: build and run the project's small Go programs.

`tests/go/nripeer` drives a plugin through containerd/nri's `pkg/adaptation` (the code containerd runs);
`tests/go/stubplugin` is a compiled plugin on `pkg/stub`, the speed yardstick. Binaries are cached by a hash
of their sources, so a rebuild happens only when the Go code or its go.mod/go.sum change.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from koordqos.testing.agentrunner import AgentPopen

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "koordqos-e2e" / "go"


class GoUnavailable(Exception):
    """No Go toolchain, or the build failed; the message says which."""


def go_unavailable() -> str | None:
    """Why Go programs cannot be built here (None when they can)."""
    if shutil.which("go") is None:
        return "no Go toolchain on PATH"
    return None


def build(src: Path, cache: Path = CACHE, timeout: float = 1800.0) -> Path:
    """`go build` the module in `src` (cached by source hash); the binary's path."""
    reason = go_unavailable()
    if reason is not None:
        raise GoUnavailable(reason)
    digest = hashlib.sha256()
    for f in sorted(src.iterdir()):
        if f.suffix == ".go" or f.name in ("go.mod", "go.sum"):
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    out = cache / f"{src.name}-{digest.hexdigest()[:16]}" / src.name
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    proc = subprocess.run(
        ["go", "build", "-o", str(tmp), "."],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CGO_ENABLED": "0"},
        check=False,
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()] or ["(no output)"]
        raise GoUnavailable(f"go build {src.name} failed: {' | '.join(lines[-3:])}")
    tmp.rename(out)
    return out


def run_peer(
    peer: Path,
    socket: Path,
    args: list[str],
    start_plugin: Any,
    timeout: float = 120.0,
    before_stop: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run nripeer on `socket` with `args`; `start_plugin()` is called once it listens and returns a
    `subprocess.Popen` or the agent (`AgentPopen`), stopped afterwards (`before_stop()` is called first, once
    the peer has finished, e.g. to read the plugin's metrics). Returns the peer's JSON output."""
    proc = subprocess.Popen(
        [str(peer), "-socket", str(socket), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    plugin: subprocess.Popen[bytes] | AgentPopen | None = None
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nripeer did not listen on {socket}")
            time.sleep(0.01)
        plugin = start_plugin()
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"nripeer exited with {proc.returncode}: {err.decode()[-2000:]}")
        doc: dict[str, Any] = json.loads(out)
        if before_stop is not None:
            before_stop()
        return doc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if isinstance(plugin, AgentPopen):
            plugin.stop(10)  # SIGTERM, then SIGKILL after 10 s
        elif plugin is not None and plugin.poll() is None:
            plugin.terminate()
            try:
                plugin.wait(10)
            except subprocess.TimeoutExpired:
                plugin.kill()
                plugin.wait()
