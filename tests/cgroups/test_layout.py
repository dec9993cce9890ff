"""CgroupLayout: detection from disk, directory naming for both drivers, file paths on v1 and v2."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.cgroups.layout import (
    CgroupDriver,
    CgroupLayout,
    ContainerRef,
    ResourceUnsupported,
    kube_qos_of_parent,
    parse_container_id,
)
from koordqos.cgroups.resources import CgroupVersion
from koordqos.errors import CgroupError
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.testing.nodefs import SyntheticNode

UID = "6a4b0c1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_ = UID.replace("-", "_")


def test_detect_matches_synthetic_tree(node: SyntheticNode) -> None:
    layout = CgroupLayout.detect(node.cgroup_root)
    assert layout.version is node.version
    assert layout.driver is node.driver
    assert not layout.hybrid


def test_detect_empty_root_defaults_to_v1_cgroupfs(tmp_path: Path) -> None:
    layout = CgroupLayout.detect(tmp_path / "nothing")
    assert (layout.version, layout.driver) == (CgroupVersion.V1, CgroupDriver.CGROUPFS)


def test_detect_explicit_overrides(tmp_path: Path) -> None:
    layout = CgroupLayout.detect(tmp_path, version=CgroupVersion.V2, driver=CgroupDriver.SYSTEMD)
    assert (layout.version, layout.driver) == (CgroupVersion.V2, CgroupDriver.SYSTEMD)


def test_detect_hybrid(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("")
    layout = CgroupLayout.detect(tmp_path)
    assert layout.version is CgroupVersion.V1
    assert layout.hybrid


def test_detect_this_machine() -> None:
    if not Path("/sys/fs/cgroup/cpu/cgroup.procs").exists():
        pytest.skip("no cgroup v1 cpu hierarchy mounted at /sys/fs/cgroup/cpu")
    assert CgroupLayout.detect("/sys/fs/cgroup").version is CgroupVersion.V1


@pytest.mark.parametrize(
    ("driver", "qos", "expected"),
    [
        (CgroupDriver.CGROUPFS, KubeQoS.GUARANTEED, "kubepods"),
        (CgroupDriver.CGROUPFS, KubeQoS.BURSTABLE, "kubepods/burstable"),
        (CgroupDriver.CGROUPFS, KubeQoS.BESTEFFORT, "kubepods/besteffort"),
        (CgroupDriver.SYSTEMD, KubeQoS.GUARANTEED, "kubepods.slice"),
        (CgroupDriver.SYSTEMD, KubeQoS.BURSTABLE, "kubepods.slice/kubepods-burstable.slice"),
        (CgroupDriver.SYSTEMD, KubeQoS.BESTEFFORT, "kubepods.slice/kubepods-besteffort.slice"),
    ],
)
def test_qos_dirs(driver: CgroupDriver, qos: KubeQoS, expected: str) -> None:
    assert CgroupLayout("/x", CgroupVersion.V1, driver).qos_dir(qos) == expected


@pytest.mark.parametrize(
    ("driver", "qos", "expected"),
    [
        (CgroupDriver.CGROUPFS, KubeQoS.GUARANTEED, f"kubepods/pod{UID}"),
        (CgroupDriver.CGROUPFS, KubeQoS.BURSTABLE, f"kubepods/burstable/pod{UID}"),
        (CgroupDriver.CGROUPFS, KubeQoS.BESTEFFORT, f"kubepods/besteffort/pod{UID}"),
        (CgroupDriver.SYSTEMD, KubeQoS.GUARANTEED, f"kubepods.slice/kubepods-pod{UID_}.slice"),
        (
            CgroupDriver.SYSTEMD,
            KubeQoS.BURSTABLE,
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
        ),
        (
            CgroupDriver.SYSTEMD,
            KubeQoS.BESTEFFORT,
            f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice",
        ),
    ],
)
def test_pod_dirs(driver: CgroupDriver, qos: KubeQoS, expected: str) -> None:
    layout = CgroupLayout("/x", CgroupVersion.V2, driver)
    assert layout.pod_dir(PodInfo(uid=UID, kube_qos=qos)) == expected


@pytest.mark.parametrize(
    ("driver", "cid", "leaf"),
    [
        (CgroupDriver.SYSTEMD, "containerd://abc123", "cri-containerd-abc123.scope"),
        (CgroupDriver.SYSTEMD, "cri-o://abc123", "crio-abc123.scope"),
        (CgroupDriver.SYSTEMD, "docker://abc123", "docker-abc123.scope"),
        (CgroupDriver.SYSTEMD, "pouch://abc123", "pouch-abc123.scope"),
        (CgroupDriver.CGROUPFS, "containerd://abc123", "abc123"),
        (CgroupDriver.CGROUPFS, "cri-o://abc123", "crio-abc123"),
        (CgroupDriver.CGROUPFS, "docker://abc123", "abc123"),
    ],
)
def test_container_dirs(driver: CgroupDriver, cid: str, leaf: str) -> None:
    layout = CgroupLayout("/x", CgroupVersion.V1, driver)
    pod = PodInfo(
        uid=UID, kube_qos=KubeQoS.BURSTABLE, containers=(ContainerInfo(name="c", container_id=cid),)
    )
    assert layout.container_dir(pod, cid) == f"{layout.pod_dir(pod)}/{leaf}"


def test_parse_container_id() -> None:
    assert parse_container_id("containerd://abc") == ContainerRef("containerd", "abc")
    with pytest.raises(CgroupError, match="no '<runtime>://' prefix"):
        parse_container_id("abc")
    with pytest.raises(CgroupError, match="unknown runtime"):
        parse_container_id("rkt://abc")


@pytest.mark.parametrize(
    ("subsystem_file", "v1", "v2"),
    [
        ("cpu.shares", "cpu/kubepods/besteffort/cpu.shares", "kubepods/besteffort/cpu.weight"),
        ("cpu.cfs_quota_us", "cpu/kubepods/besteffort/cpu.cfs_quota_us", "kubepods/besteffort/cpu.max"),
        ("cpuset.cpus", "cpuset/kubepods/besteffort/cpuset.cpus", "kubepods/besteffort/cpuset.cpus"),
        (
            "memory.limit_in_bytes",
            "memory/kubepods/besteffort/memory.limit_in_bytes",
            "kubepods/besteffort/memory.max",
        ),
    ],
)
def test_file_paths(tmp_path: Path, subsystem_file: str, v1: str, v2: str) -> None:
    rel = "kubepods/besteffort"
    assert CgroupLayout(tmp_path, CgroupVersion.V1).file_path(rel, subsystem_file) == tmp_path / v1
    assert CgroupLayout(tmp_path, CgroupVersion.V2).file_path(rel, subsystem_file) == tmp_path / v2


def test_file_path_of_version_specific_resource(tmp_path: Path) -> None:
    with pytest.raises(ResourceUnsupported):
        CgroupLayout(tmp_path, CgroupVersion.V2).file_path("kubepods", "net_cls.classid")


def test_normalize_parent_cgroupfs() -> None:
    layout = CgroupLayout("/x", CgroupVersion.V1, CgroupDriver.CGROUPFS)
    assert layout.normalize_parent(f"/kubepods/besteffort/pod{UID}/") == f"kubepods/besteffort/pod{UID}"


def test_normalize_parent_systemd() -> None:
    layout = CgroupLayout("/x", CgroupVersion.V2, CgroupDriver.SYSTEMD)
    assert layout.normalize_parent(f"kubepods-besteffort-pod{UID_}.slice") == (
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
    )
    assert layout.normalize_parent(f"kubepods-pod{UID_}.slice:cri-containerd:abc") == (
        f"kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-abc.scope"
    )


@pytest.mark.parametrize(
    ("rel", "qos"),
    [
        ("kubepods/besteffort/podx", KubeQoS.BESTEFFORT),
        ("kubepods.slice/kubepods-burstable.slice", KubeQoS.BURSTABLE),
        ("kubepods/podx", KubeQoS.GUARANTEED),
    ],
)
def test_kube_qos_of_parent(rel: str, qos: KubeQoS) -> None:
    assert kube_qos_of_parent(rel) is qos


def test_capabilities_detected_once(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path, extensions={"cpu.idle"})
    layout = CgroupLayout.detect(node.cgroup_root)
    assert layout.supports("cpu.idle")
    assert not layout.supports("cpu.bvt_warp_ns")
    assert not layout.supports("memory.min")
    assert layout.supports("cpu.shares")
    # cached: a file appearing later is not seen until refresh
    (node.cgroup_root / "cpu" / "kubepods" / "cpu.bvt_warp_ns").write_text("0\n")
    assert not layout.supports("cpu.bvt_warp_ns")
    layout.refresh_capabilities()
    assert layout.supports("cpu.bvt_warp_ns")
    assert layout.group_identity_supported()


def test_v2_capabilities_from_controllers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    layout = CgroupLayout.detect(tmp_path)  # no kubepods yet: the root has no cpu.max but cpu is enabled
    assert layout.supports("cpu.cfs_quota_us")
    assert not layout.supports("cpuset.cpus")
    assert not layout.supports("blkio.cost.weight")


def test_core_sched_detection(tmp_path: Path) -> None:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    layout = CgroupLayout(tmp_path, proc_root=proc, sys_root=sys)
    assert layout.core_sched_supported() == (False, "not supported neither by sysctl nor by sched_features")
    (sys / "kernel/debug").mkdir(parents=True)
    (sys / "kernel/debug/sched_features").write_text("GENTLE_FAIR_SLEEPERS CORE_SCHED\n")
    layout.refresh_capabilities()
    assert layout.core_sched_supported() == (True, "sched_features supported")
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/sched_core").write_text("1\n")
    layout.refresh_capabilities()
    assert layout.core_sched_supported() == (True, "sysctl supported")
