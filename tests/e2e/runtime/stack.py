"""One test's stack: containerd, crictl and the agent(s) on one scratch cgroup tree, all torn down after."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from koordqos.testing.poll import ConditionTimeout, wait_until_sync

from .agentproc import Agent
from .cgview import CGROUP_MNT, SEPARATE, CgroupTree, Layout, host_cgroup_listing
from .containerd import Containerd
from .cri import CRI
from .prereq import POLL, Toolchain

T = TypeVar("T")


def wait_reading(read: Callable[[], T], ok: Callable[[T], bool], timeout: float, what: str) -> T:
    """Poll `read()` until `ok` holds for its value, which is returned; on the deadline the failure names
    the last value read (so a report says what the kernel file held, not only that it timed out)."""
    last: list[T] = []

    def check() -> bool:
        last[:] = [read()]
        return ok(last[0])

    try:
        wait_until_sync(check, timeout, POLL, what)
    except ConditionTimeout as exc:
        raise ConditionTimeout(f"{exc}; last read: {last[0]!r}" if last else str(exc)) from None
    return last[0]


@dataclass
class Stack:
    """containerd + crictl + (optionally several runs of) the agent on one scratch cgroup tree."""

    tools: Toolchain
    workdir: Path
    tree: CgroupTree
    containerd: Containerd
    cri: CRI
    agents: list[Agent] = field(default_factory=list)

    def agent(self, *args: str, nodeslo: dict[str, Any] | None = None) -> Agent:
        """A (not yet started) agent; `nodeslo` is written as its --nodeslo-file."""
        extra = list(args)
        if nodeslo is not None:
            path = self.workdir / f"nodeslo-{len(self.agents)}.json"
            path.write_text(json.dumps(nodeslo))
            extra += ["--nodeslo-file", str(path)]
        a = Agent(self.tree, self.workdir, self.containerd.nri_socket, extra)
        self.agents.append(a)
        return a

    def diagnostics(self) -> str:
        parts = [f"--- containerd log ---\n{self.containerd.log_tail(30)}"]
        for i, a in enumerate(self.agents):
            parts.append(f"--- agent {i} log ---\n{a.log_tail(30)}")
        return "\n".join(parts)


@contextlib.contextmanager
def stack(tools: Toolchain, layout: Layout = SEPARATE) -> Iterator[Stack]:
    """Build the stack with its cgroup view in `layout`; everything is stopped and removed afterwards, also
    when the test fails. The host's /sys/fs/cgroup tmpfs must be as it was: a stack that changed it fails."""
    host_before = host_cgroup_listing()
    workdir = Path(tempfile.mkdtemp(prefix="kqe2e-", dir="/tmp"))  # short: unix socket paths ≤ 107 bytes
    view_dir = workdir / "cgview"
    view_dir.mkdir()
    tree = CgroupTree(layout=layout, view_dir=view_dir)
    containerd = Containerd(tools, tree, workdir)
    cri = CRI(tools["CRICTL"], containerd.address, workdir)
    st = Stack(tools, workdir, tree, containerd, cri)
    problems: list[str] = []
    try:
        tree.create()
        containerd.start(cri)
        assert containerd.proc is not None
        tree.check_view(containerd.proc.pid)
        containerd.import_images()
        yield st
    except BaseException:
        sys.stderr.write(st.diagnostics() + "\n")
        raise
    finally:
        for a in st.agents:
            a.stop()
        if containerd.proc is not None and containerd.proc.poll() is None:
            cri.remove_all()
        containerd.stop()
        containerd.kill_shims()
        problems += tree.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
        if workdir.exists():
            problems.append(f"{workdir} not removed")
        host_after = host_cgroup_listing()
        if host_after != host_before:
            problems.append(f"the host's {CGROUP_MNT} changed: {host_before} -> {host_after}")
        if problems:
            sys.stderr.write("e2e-runtime cleanup: " + "; ".join(problems) + "\n")
    # reached whenever the body did not raise into the generator: a pytest fixture's teardown always (a
    # test's failure is not thrown into its fixtures); otherwise the cleanup line above reported it
    assert host_after == host_before, f"the host's {CGROUP_MNT} changed: {host_before} -> {host_after}"
    if "cpu,cpuacct" not in dict(host_before):  # this machine: the systemd view's name is not the host's
        assert "cpu,cpuacct" not in dict(host_after), f"{CGROUP_MNT}/cpu,cpuacct created on the host"
