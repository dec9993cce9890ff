"""The containerd config the e2e runs with is the one docs/deployment.md tells users to write.

The e2e reads the `[plugins.'io.containerd.nri.v1.nri']` block from the doc's "containerd 2.x" section and
writes it into its containerd config unchanged except for the paths (socket, plugin dirs: private temp
dirs instead of the machine's). The first test (no runtime needed) checks that rendering; the second asks
the real containerd what it made of the file; every other e2e-runtime test runs on it.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from .cgview import CgroupTree
from .containerd import Containerd, doc_nri_section
from .prereq import Toolchain
from .stack import Stack

PATH_KEYS = {"socket_path", "plugin_path", "plugin_config_path"}


def test_the_e2e_config_carries_the_documented_nri_section(tmp_path: Path) -> None:
    doc = doc_nri_section()
    # what users must get right (docs/deployment.md, "3. Enabling NRI in the container runtime"): NRI on,
    # external plugins allowed, both timeouts here
    assert doc["disable"] is False
    assert doc["disable_connections"] is False
    assert doc["socket_path"] == "/var/run/nri/nri.sock"
    assert {"plugin_registration_timeout", "plugin_request_timeout"} <= set(doc)
    tools = Toolchain({"PAUSE_IMAGE": "localhost/p:1", "RUNC": "/usr/sbin/runc", "SHIM_DIR": "/nonexistent"})
    ctrd = Containerd(tools, CgroupTree(hierarchies=[]), tmp_path)
    rendered = tomllib.loads(ctrd.config_text())["plugins"]["io.containerd.nri.v1.nri"]
    assert {k: v for k, v in rendered.items() if k not in PATH_KEYS} == {
        k: v for k, v in doc.items() if k not in PATH_KEYS
    }
    assert rendered["socket_path"] == str(tmp_path / "nri" / "nri.sock")
    assert all(str(rendered[k]).startswith(str(tmp_path)) for k in PATH_KEYS)


@pytest.mark.e2e_runtime
def test_containerd_takes_the_documented_nri_section(rt: Stack, tools: Toolchain) -> None:
    proc = subprocess.run(
        [tools["CONTAINERD"], "--config", str(rt.containerd.config_path), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    effective = tomllib.loads(proc.stdout)
    nri = effective["plugins"]["io.containerd.nri.v1.nri"]
    doc = doc_nri_section()
    for key, value in doc.items():
        if key not in PATH_KEYS:
            assert nri[key] == value, f"containerd's effective {key} is {nri[key]!r}, the doc says {value!r}"
    assert nri["socket_path"] == str(rt.containerd.nri_socket)
    assert rt.containerd.nri_socket.is_socket()  # and it is listening there
    assert effective["root"] == str(rt.workdir / "root")  # never /var/lib/containerd
    assert effective["state"] == str(rt.workdir / "state")  # never /run/containerd
