"""Path confinement: hostile pod UIDs, container ids and cgroup parents never reach outside the root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Outcome
from koordqos.cgroups.layout import PATH_REFUSED, CgroupDriver, CgroupLayout, check_relative
from koordqos.cgroups.resources import CgroupVersion
from koordqos.decisions import DecisionLog
from koordqos.errors import PathEscapeError
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.testing.nodefs import SyntheticNode

HOSTILE_UIDS = ["../../etc", "..", "a/b", "/etc", "x\x00y", "", "uid/../../../x", ".hidden", "a b"]
HOSTILE_IDS = [
    "containerd://../../etc",
    "containerd:///etc",
    "docker://a/b",
    "cri-o://..",
    "containerd://",
    "containerd://a\x00b",
]
HOSTILE_PARENTS = ["../../etc", "/etc", "kubepods/../../../tmp", "kubepods/..", "a\x00b", "/"]


def refused(reason: str) -> float:
    return PATH_REFUSED.labels(reason)._value.get()


@pytest.mark.parametrize("uid", HOSTILE_UIDS)
@pytest.mark.parametrize("driver", list(CgroupDriver))
def test_hostile_pod_uid_refused(uid: str, driver: CgroupDriver) -> None:
    layout = CgroupLayout("/sys/fs/cgroup", CgroupVersion.V1, driver)
    before = refused("pod-uid")
    with pytest.raises(PathEscapeError, match="pod uid"):
        layout.pod_dir(PodInfo(uid=uid, kube_qos=KubeQoS.BESTEFFORT))
    assert refused("pod-uid") == before + 1


@pytest.mark.parametrize("cid", HOSTILE_IDS)
@pytest.mark.parametrize("driver", list(CgroupDriver))
def test_hostile_container_id_refused(cid: str, driver: CgroupDriver) -> None:
    layout = CgroupLayout("/sys/fs/cgroup", CgroupVersion.V1, driver)
    with pytest.raises(PathEscapeError, match="container id"):
        layout.container_dir_in("kubepods/podabc", cid)


@pytest.mark.parametrize("parent", HOSTILE_PARENTS[:5])
def test_hostile_relative_dirs_refused(parent: str) -> None:
    with pytest.raises(PathEscapeError):
        check_relative(parent)


@pytest.mark.parametrize(
    "parent", ["/kubepods/../../etc", "kubepods-besteffort-pod..slice:cri-containerd:../x", "../x.slice"]
)
def test_hostile_runtime_parents_refused(parent: str) -> None:
    layout = CgroupLayout("/sys/fs/cgroup", CgroupVersion.V2, CgroupDriver.SYSTEMD)
    with pytest.raises(PathEscapeError):
        layout.normalize_parent(parent)


def _outside_target(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "cpu.shares"
    target.write_text("1024\n")
    return outside


@pytest.mark.parametrize("parent", HOSTILE_PARENTS)
async def test_executor_refuses_hostile_parent_and_records(tmp_path: Path, parent: str) -> None:
    node = SyntheticNode(tmp_path / "node")
    outside = _outside_target(tmp_path)
    decisions = DecisionLog()
    ex = CgroupExecutor(node.layout, decisions)
    if parent == "/":
        parent = str(outside)  # an absolute path to a real dir holding a cpu.shares file
    [res] = await ex.apply("test", [CgroupWrite(parent, "cpu.shares", 2)])
    assert res.outcome is Outcome.REFUSED
    assert not res.ok
    assert (outside / "cpu.shares").read_text() == "1024\n"
    assert ex.file_writes == 0
    [d] = decisions.recent()
    assert d.action == "write-refused"
    assert d.strategy == "test"


async def test_symlinked_dir_escape_refused(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    outside = _outside_target(tmp_path)
    os.symlink(outside, node.cgroup_root / "cpu" / "kubepods" / "evil")
    before = refused("symlink")
    ex = CgroupExecutor(node.layout, DecisionLog())
    [res] = await ex.apply("test", [CgroupWrite("kubepods/evil", "cpu.shares", 2)])
    assert res.outcome is Outcome.REFUSED
    assert "outside" in res.error
    assert refused("symlink") == before + 1
    assert (outside / "cpu.shares").read_text() == "1024\n"


async def test_symlinked_leaf_file_not_followed(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    outside = _outside_target(tmp_path)
    leaf = node.cgroup_root / "cpu" / "kubepods" / "besteffort" / "cpu.shares"
    leaf.unlink()
    os.symlink(outside / "cpu.shares", leaf)
    ex = CgroupExecutor(node.layout, DecisionLog())
    [res] = await ex.apply("test", [CgroupWrite("kubepods/besteffort", "cpu.shares", 2, cacheable=False)])
    assert res.outcome is Outcome.FAILED  # O_NOFOLLOW: ELOOP
    assert (outside / "cpu.shares").read_text() == "1024\n"


def test_symlinked_root_itself_is_fine(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    link = tmp_path / "link"
    os.symlink(node.cgroup_root, link)
    layout = CgroupLayout(link, CgroupVersion.V1)
    assert layout.file_path("kubepods", "cpu.shares") == link / "cpu/kubepods/cpu.shares"


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=40))
def test_any_uid_is_refused_or_stays_inside(uid: str) -> None:
    root = Path("/sys/fs/cgroup")
    for driver in CgroupDriver:
        layout = CgroupLayout(root, CgroupVersion.V1, driver)
        try:
            rel = layout.pod_dir_for(uid, KubeQoS.BURSTABLE)
        except PathEscapeError:
            continue
        path = os.path.normpath(root / "cpu" / rel / "cpu.shares")
        assert path.startswith(str(root / "cpu" / layout.qos_dir(KubeQoS.BURSTABLE)) + "/")
        assert rel.count("/") == layout.qos_dir(KubeQoS.BURSTABLE).count("/") + 1
