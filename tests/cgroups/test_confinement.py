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
from koordqos.cgroups.threads import pod_thread_ids
from koordqos.decisions import DecisionLog
from koordqos.errors import PathEscapeError
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.strategyenv import strategy_env

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
    assert res.outcome is Outcome.REFUSED  # a symlink beneath the root: refused at the open (koordqos.fs)
    assert (outside / "cpu.shares").read_text() == "1024\n"


def test_symlinked_root_itself_is_fine(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    link = tmp_path / "link"
    os.symlink(node.cgroup_root, link)
    layout = CgroupLayout(link, CgroupVersion.V1)
    # the root is a flag (trusted as given); the controller link beneath it is resolved to its dir
    assert layout.file_path("kubepods", "cpu.shares") == link / "cpu,cpuacct/kubepods/cpu.shares"
    assert layout.subsystem_dir("kubepods", "cpuacct") == link / "cpu,cpuacct/kubepods"


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


async def test_a_pod_dir_swapped_for_a_symlink_between_two_writes_is_refused_at_the_second(
    tmp_path: Path,
) -> None:
    # issue #15 item 2: the layout's first realpath check was cached, so the swapped dir was followed and
    # memory.limit_in_bytes outside the root was changed
    node = SyntheticNode(tmp_path / "node")
    layout = node.layout
    pod_dir = "kubepods/besteffort/podswap"
    node.make_cgroup(pod_dir)
    executor = CgroupExecutor(layout, DecisionLog())
    first = await executor.update(
        "t", CgroupWrite(pod_dir, "memory.limit_in_bytes", 1 << 30, cacheable=False)
    )
    assert first.outcome is Outcome.WRITTEN
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    real = node.cgroup_root / "memory" / pod_dir
    os.rename(real, tmp_path / "moved-away")
    os.symlink(outside, real)
    before = refused("symlink")
    second = await executor.update(
        "t", CgroupWrite(pod_dir, "memory.limit_in_bytes", 2 << 30, cacheable=False)
    )
    assert second.outcome is Outcome.REFUSED
    assert (outside / "memory.limit_in_bytes").read_text() == "9223372036854771712\n"
    assert refused("symlink") == before + 1
    assert executor.read(pod_dir, "memory.limit_in_bytes") is None  # reads are confined the same way


def _swap_for_symlink(node: SyntheticNode, tmp_path: Path, subsystem: str, rel: str) -> Path:
    """Replace `rel` in `subsystem` by a symlink to a directory outside the root; returns that directory."""
    real = node.cgroup_root / subsystem / rel
    outside = tmp_path / f"outside-{subsystem}"
    os.rename(real, outside)  # the outside dir keeps the files (and sub-dirs) the agent saw a moment ago
    os.symlink(outside, real)
    return outside


def test_check_dir_is_not_cached_a_swap_is_seen_at_the_next_check(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    pod_dir = "kubepods/besteffort/podswap"
    node.make_cgroup(pod_dir)
    layout = node.layout
    layout.check_dir(pod_dir, "cpu")  # a real dir: fine
    _swap_for_symlink(node, tmp_path, "cpu", pod_dir)
    before = refused("symlink")
    with pytest.raises(PathEscapeError, match="symlink 'podswap'"):
        layout.check_dir(pod_dir, "cpu")
    assert refused("symlink") == before + 1
    # the path string itself is only a string: no resolution, so nothing to remember
    assert layout.subsystem_dir(pod_dir, "cpu") == node.cgroup_root / "cpu,cpuacct" / pod_dir
    assert layout.file_rel(pod_dir, "cpu.shares") == f"cpu,cpuacct/{pod_dir}/cpu.shares"


def test_pod_threads_are_not_read_through_a_pod_dir_swapped_for_a_symlink(tmp_path: Path) -> None:
    # the resctrl hook assigns these tids to a group: read through a symlink they would be another cgroup's
    node = SyntheticNode(tmp_path / "node")
    pod_dir = "kubepods/besteffort/podswap"
    node.make_cgroup(pod_dir)
    node.make_cgroup(f"{pod_dir}/ctr1")
    (node.cgroup_root / "cpu" / pod_dir / "tasks").write_text("10\n")
    (node.cgroup_root / "cpu" / pod_dir / "ctr1" / "tasks").write_text("11\n12\n")
    assert pod_thread_ids(node.layout, pod_dir) == [10, 11, 12]
    outside = _swap_for_symlink(node, tmp_path, "cpu", pod_dir)
    (outside / "tasks").write_text("1\n")  # e.g. the host's init
    (outside / "ctr1" / "tasks").write_text("2\n")
    assert pod_thread_ids(node.layout, pod_dir) == []


def test_cgroup_listings_do_not_follow_a_dir_swapped_for_a_symlink(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    be = node.layout.qos_dir(KubeQoS.BESTEFFORT)
    node.make_cgroup(f"{be}/poda")
    assert node.layout.list_subdirs(be, "cpu") == ["poda"]
    _swap_for_symlink(node, tmp_path, "cpu", be)
    assert node.layout.list_subdirs(be, "cpu") == []
    assert node.layout.list_subdirs("kubepods", "cpu") == ["burstable"]  # the symlink itself is no dir


def test_be_cpuset_walk_does_not_descend_through_a_symlink(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    be = node.layout.qos_dir(KubeQoS.BESTEFFORT)
    node.make_cgroup(f"{be}/poda/ctr")
    env = strategy_env(node.layout)
    assert [d.path for d in env.be_cpuset_dirs()] == [be, f"{be}/poda", f"{be}/poda/ctr"]
    _swap_for_symlink(node, tmp_path, "cpuset", be)
    # the QoS dir itself is still named (its writes are refused at the open); nothing below it is listed
    assert [d.path for d in env.be_cpuset_dirs()] == [be]
