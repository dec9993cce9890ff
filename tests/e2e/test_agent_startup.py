"""Start-up misconfiguration (issue #15 items 6, 7): the agent process exits non-zero with one line naming
the problem and no traceback, or (a controller missing) stays up but unready with the reason."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from koordqos.testing.agentproc import agent_argv, agent_env, free_port
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

pytestmark = pytest.mark.e2e


def _argv(node: SyntheticNode | None, tmp: Path, port: int, **roots: Path) -> list[str]:
    cgroup = roots.get("cgroup", node.cgroup_root if node else tmp / "cg")
    proc = roots.get("proc", node.proc_root if node else tmp / "proc")
    sys_root = roots.get("sys", node.sys_root if node else tmp / "sys")
    return agent_argv(
        "--cgroup-root",
        str(cgroup),
        "--proc-root",
        str(proc),
        "--sys-root",
        str(sys_root),
        "--nri-socket",
        str(tmp / "nri.sock"),
        "--http-addr",
        f"127.0.0.1:{port}",
        "--log-format",
        "json",
    )


def _one_line_exit(
    argv: list[str], tmp: Path, needle: str, code: int = 2, within: float = 20.0, only_line: bool = True
) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=agent_env(home=tmp), check=False
    )
    took = time.monotonic() - started
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    if only_line:
        assert len(lines) == 1, proc.stderr
    # the error is the last line and the only one naming the problem; nothing was retried
    assert needle in lines[-1]
    assert [line for line in lines if needle in line] == [lines[-1]], proc.stderr
    assert "crashed" not in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert took < within  # interpreter start-up included; no retry loop


@pytest.mark.parametrize("which", ["cgroup", "proc", "sys"])
def test_a_missing_root_exits_2_naming_the_path(tmp_path: Path, which: str) -> None:
    node = SyntheticNode(tmp_path / "node")
    missing = tmp_path / "does-not-exist"
    argv = _argv(node, tmp_path, free_port(), **{which: missing})
    _one_line_exit(argv, tmp_path, f"--{which}-root {missing}: does not exist")


def test_a_cgroup_root_without_a_hierarchy_exits_2(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_exit(
        _argv(node, tmp_path, free_port(), cgroup=empty), tmp_path, f"--cgroup-root {empty}: no cgroup"
    )


def test_http_address_in_use_exits_quickly_with_one_line(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # the start-up info lines come first (components are being started); then one error line
        _one_line_exit(
            _argv(node, tmp_path, port), tmp_path, f"--http-addr 127.0.0.1:{port}", code=2, only_line=False
        )


async def test_a_missing_controller_keeps_readyz_503_with_the_reason(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    for sub in ("memory",):  # a v1 hierarchy without the memory controller
        import shutil

        shutil.rmtree(node.cgroup_root / sub)
    port = free_port()
    argv = [*_argv(node, tmp_path, port), "--feature-gates", "BEMemoryEvict=true"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=agent_env(home=tmp_path)
    )
    try:
        body: dict[str, object] = {}
        async with aiohttp.ClientSession() as session:

            async def answered() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        body.update(await resp.json())
                        return resp.status == 503 and "synced" in body and len(body["synced"]) == 3  # type: ignore[arg-type]
                except aiohttp.ClientError:
                    return False

            await wait_until(answered, timeout=60, interval=0.1, message="/readyz answering")
        assert body["ready"] is False
        reason = str(body["not_ready"])
        assert "memory (needed by" in reason
        assert "BEMemoryEvict" in reason
        assert "BatchResource" in reason
        assert proc.poll() is None  # still running
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    _ = json  # (json bodies parsed by aiohttp)


def test_a_controller_link_out_of_the_root_exits_2_naming_it(tmp_path: Path) -> None:
    """systemd's `cpu -> cpu,cpuacct` is followed once at start; a link that leads out of the cgroup root is a
    start-up error, before anything is written."""
    node = SyntheticNode(tmp_path / "node")
    elsewhere = tmp_path / "elsewhere"
    (node.cgroup_root / "cpu,cpuacct").rename(elsewhere)
    (node.cgroup_root / "cpu").unlink()
    (node.cgroup_root / "cpu").symlink_to(elsewhere)
    _one_line_exit(
        _argv(node, tmp_path, free_port()),
        tmp_path,
        f"cgroup controller cpu: {node.cgroup_root / 'cpu'} -> {elsewhere} leads outside the cgroup root",
    )
