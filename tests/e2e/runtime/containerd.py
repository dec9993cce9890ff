"""containerd on private sockets and dirs (never /run/containerd, /var/lib/containerd, /var/run/nri),
with the NRI section docs/deployment.md tells users to write."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from koordqos.testing.agentrunner import terminate
from koordqos.testing.poll import wait_until_sync

from .cgview import CgroupTree
from .cri import CRI
from .prereq import POLL, REPO, Toolchain, Unavailable

DEPLOYMENT_DOC = REPO / "docs" / "deployment.md"


def doc_nri_section(doc: Path = DEPLOYMENT_DOC) -> dict[str, Any]:
    """The `[plugins.'io.containerd.nri.v1.nri']` block users are told to write (docs/deployment.md,
    "containerd 2.x"), parsed."""
    text = doc.read_text()
    head = text.index("### containerd 2.x")
    m = re.search(r"```toml\n(.*?)```", text[head:], re.S)
    if m is None:
        raise AssertionError("docs/deployment.md: no toml block under 'containerd 2.x'")
    doc_cfg = tomllib.loads(m.group(1))
    return dict(doc_cfg["plugins"]["io.containerd.nri.v1.nri"])


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


@dataclass
class Containerd:
    """containerd on private sockets and dirs under `workdir`, in the scratch cgroup view."""

    tools: Toolchain
    tree: CgroupTree
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        return self.workdir / "nri" / "nri.sock"

    @property
    def log_path(self) -> Path:
        return self.workdir / "containerd.log"

    def nri_section(self) -> dict[str, Any]:
        """The documented NRI section; only the paths are moved into the temp dir."""
        section = doc_nri_section()
        section["socket_path"] = str(self.nri_socket)
        section["plugin_path"] = str(self.workdir / "nri" / "plugins")
        section["plugin_config_path"] = str(self.workdir / "nri" / "conf.d")
        return section

    def config_text(self) -> str:
        w = self.workdir
        nri = "\n".join(f"  {k} = {_toml_value(v)}" for k, v in self.nri_section().items())
        return f"""version = 3
root = "{w}/root"
state = "{w}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.address}"
[ttrpc]
  address = "{self.address}.ttrpc"
[debug]
  address = "{w}/debug.sock"
  level = "info"
[metrics]
  address = ""

[plugins.'io.containerd.nri.v1.nri']
{nri}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{self.tools["PAUSE_IMAGE"]}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # the test machines withhold CAP_SYS_RESOURCE: no oom_score_adj below containerd's own (the sandbox's -998)
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{self.tools["RUNC"]}"
        Root = "{w}/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{w}/cni/bin"]
    conf_dir = "{w}/cni/net.d"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    @property
    def config_path(self) -> Path:
        return self.workdir / "containerd.toml"

    def env(self) -> dict[str, str]:
        path = f"{self.tools['SHIM_DIR']}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return {"PATH": path, "HOME": str(self.workdir), "TMPDIR": str(self.workdir / "tmp")}

    def start(self, cri: CRI, timeout: float = 60.0) -> None:
        """Start containerd and wait until its CRI answers."""
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        (self.workdir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())
        log = open(self.log_path, "ab")  # noqa: SIM115 - the process owns it until stop()
        self.proc = subprocess.Popen(
            self.tree.wrap([self.tools["CONTAINERD"], "--config", str(self.config_path)]),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
        )
        log.close()
        self.starts += 1
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise Unavailable(f"containerd exited with {proc.returncode}: {self.log_tail()}")
            return cri.ok("info")

        try:
            wait_until_sync(up, timeout, POLL, "containerd's CRI to answer")
        except Unavailable as exc:
            raise AssertionError(str(exc)) from None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def ctr(self, *args: str, timeout: float = 120.0) -> str:
        proc = subprocess.run(
            [self.tools["CTR"], "--address", str(self.address), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def import_images(self) -> None:
        for key in ("PAUSE_TAR", "WORKLOAD_TAR"):
            self.ctr("images", "import", "--local", "--snapshotter", "overlayfs", self.tools[key])

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; the running containers (their shims) stay."""
        proc = self.proc
        if proc is None:
            return None
        self.proc = None
        return terminate(proc, timeout)

    def kill_shims(self) -> list[int]:
        """SIGKILL every process started for this containerd (shims, runc) still alive; their pids."""
        mine = str(self.workdir).encode()
        killed: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if mine in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.append(int(entry.name))
        return killed
