"""One test's stack: containerd, crictl and the agent(s) on one scratch cgroup tree, all torn down after."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .agentproc import Agent
from .cgview import CgroupTree
from .containerd import Containerd
from .cri import CRI
from .prereq import Toolchain


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
def stack(tools: Toolchain) -> Iterator[Stack]:
    """Build the stack; everything is stopped and removed afterwards, also when the test fails."""
    workdir = Path(tempfile.mkdtemp(prefix="kqe2e-", dir="/tmp"))  # short: unix socket paths ≤ 107 bytes
    tree = CgroupTree()
    containerd = Containerd(tools, tree, workdir)
    cri = CRI(tools["CRICTL"], containerd.address, workdir)
    st = Stack(tools, workdir, tree, containerd, cri)
    problems: list[str] = []
    try:
        tree.create()
        containerd.start(cri)
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
        if problems:
            sys.stderr.write("e2e-runtime cleanup: " + "; ".join(problems) + "\n")
