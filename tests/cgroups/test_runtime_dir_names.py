"""Container cgroup dir names as each runtime makes them (containerd, CRI-O; cgroupfs, systemd; v1, v2).

The expected names are spelled out here, not derived from the layout: CRI-O with the cgroupfs driver names a
container's dir `crio-<id>` (koordlet assumes `<id>`; `--cgroupfs-crio-bare-container-dirs` keeps that).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.cli import build_parser
from koordqos.configload import load_config

UID = "6a2b4c1d-0000-4000-8000-00000000abcd"
UID_ = UID.replace("-", "_")
CID = "0123456789abcdef"

CASES = [
    # runtime, driver, the leaf the runtime creates inside the pod dir
    ("containerd", CgroupDriver.CGROUPFS, CID),
    ("containerd", CgroupDriver.SYSTEMD, f"cri-containerd-{CID}.scope"),
    ("cri-o", CgroupDriver.CGROUPFS, f"crio-{CID}"),
    ("cri-o", CgroupDriver.SYSTEMD, f"crio-{CID}.scope"),
]


def pod_dir_of(driver: CgroupDriver) -> str:
    if driver is CgroupDriver.SYSTEMD:
        return f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
    return f"kubepods/besteffort/pod{UID}"


@pytest.mark.parametrize("version", list(CgroupVersion), ids=str)
@pytest.mark.parametrize(("runtime", "driver", "leaf"), CASES, ids=str)
def test_layout_finds_the_dir_the_runtime_made(
    tmp_path: Path, version: CgroupVersion, runtime: str, driver: CgroupDriver, leaf: str
) -> None:
    layout = CgroupLayout(tmp_path, version, driver)
    rel = f"{pod_dir_of(driver)}/{leaf}"
    # make the container dir by hand, the way the runtime does, with a quota in it
    cpu_dir = tmp_path / rel if version is CgroupVersion.V2 else tmp_path / "cpu" / rel
    cpu_dir.mkdir(parents=True)
    if version is CgroupVersion.V2:
        (cpu_dir / "cpu.max").write_text("50000 100000\n")
    else:
        (cpu_dir / "cpu.cfs_quota_us").write_text("50000\n")
        (cpu_dir / "cpu.cfs_period_us").write_text("100000\n")

    found = layout.container_dir_in(pod_dir_of(driver), f"{runtime}://{CID}")

    assert found == rel
    assert CgroupReader(layout).cpu_quota_period(found) == (50000, 100000)


def test_koordlet_bare_ids_behind_the_flag(tmp_path: Path) -> None:
    cfg = load_config(
        build_parser().parse_args(["run", "--cgroupfs-crio-bare-container-dirs", "true"]), env={}
    )
    assert cfg.paths.crio_cgroupfs_bare_ids is True
    layout = CgroupLayout(tmp_path, CgroupVersion.V1, CgroupDriver.CGROUPFS, crio_cgroupfs_bare_ids=True)
    assert layout.container_dir_in(pod_dir_of(CgroupDriver.CGROUPFS), f"cri-o://{CID}").endswith(f"/{CID}")
    # systemd scopes are the runtime's own names either way
    sd = CgroupLayout(tmp_path, CgroupVersion.V1, CgroupDriver.SYSTEMD, crio_cgroupfs_bare_ids=True)
    assert sd.container_dir_in(pod_dir_of(CgroupDriver.SYSTEMD), f"cri-o://{CID}").endswith(
        f"/crio-{CID}.scope"
    )


def test_default_follows_crio() -> None:
    assert load_config(build_parser().parse_args(["run"]), env={}).paths.crio_cgroupfs_bare_ids is False
