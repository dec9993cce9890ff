"""Controller directories: systemd's co-mounted v1 layout (`cpu -> cpu,cpuacct`), resolved once, checked,
confined beneath the resolved dir; a link out of the root is a start-up error; a changed link is followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from koordqos.cgroups.controllers import parse_mountinfo, resolve_controllers
from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Outcome
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.cgroups.roots import check_host_roots
from koordqos.decisions import DecisionLog
from koordqos.errors import ConfigError
from koordqos.model.qos import KubeQoS
from koordqos.strategies.cpuburst import NAME as CPU_BURST
from koordqos.testing.nodefs import SyntheticNode, V1Mounts

BE = "kubepods/besteffort"


def test_systemd_layout_is_resolved_to_the_co_mounted_dirs(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path)
    assert os.readlink(node.cgroup_root / "cpu") == "cpu,cpuacct"
    dirs = resolve_controllers(node.cgroup_root)
    assert dict(dirs.dirs) == {
        "cpu": "cpu,cpuacct",
        "cpuacct": "cpu,cpuacct",
        "cpuset": "cpuset",
        "memory": "memory",
        "blkio": "blkio",
        "net_cls": "net_cls,net_prio",
        "net_prio": "net_cls,net_prio",
    }
    assert dirs.problems == {}
    layout = CgroupLayout.detect(node.cgroup_root)
    assert layout.file_rel(BE, "cpu.cfs_quota_us") == f"cpu,cpuacct/{BE}/cpu.cfs_quota_us"
    assert layout.subsystem_rel(BE, "cpuacct") == f"cpu,cpuacct/{BE}"
    assert layout.subsystem_rel(BE, "memory") == f"memory/{BE}"


async def test_writes_and_reads_go_through_the_resolved_dir(tmp_path: Path) -> None:
    """The issue's reproduction: on the systemd layout the agent wrote nothing to the cpu controller and
    read 0 pod CPU. Now the BE quota lands and cpuacct is read."""
    node = SyntheticNode(tmp_path)
    layout = CgroupLayout.detect(node.cgroup_root)
    layout.resolve_controllers()
    ex = CgroupExecutor(layout, DecisionLog())
    [res] = await ex.apply("test", [CgroupWrite(BE, "cpu.cfs_quota_us", 260000, cacheable=False)])
    assert res.outcome is Outcome.WRITTEN, res.error
    assert (node.cgroup_root / "cpu,cpuacct" / BE / "cpu.cfs_quota_us").read_text() == "260000"
    node.add_cpu_usage(BE, 5_000_000)
    assert CgroupReader(layout).cpu_usage_ns(BE) == 5_000_000


async def test_a_symlink_below_the_resolved_dir_is_still_refused(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.shares").write_text("1024\n")
    real = node.cgroup_root / "cpu,cpuacct" / BE
    for f in real.iterdir():
        f.unlink()
    real.rmdir()
    real.symlink_to(outside)
    ex = CgroupExecutor(node.layout, DecisionLog())
    [res] = await ex.apply("test", [CgroupWrite(BE, "cpu.shares", 2, cacheable=False)])
    assert res.outcome is Outcome.REFUSED
    assert (outside / "cpu.shares").read_text() == "1024\n"


def test_a_controller_link_out_of_the_root_is_a_start_up_error(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node", v1_mounts=V1Mounts.SEPARATE)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.rename(node.cgroup_root / "cpu", outside / "cpu")
    (node.cgroup_root / "cpu").symlink_to(outside / "cpu")
    with pytest.raises(ConfigError) as err:
        check_host_roots(node.cgroup_root, node.proc_root, node.sys_root)
    msg = str(err.value)
    assert "\n" not in msg
    assert "cgroup controller cpu" in msg
    assert "leads outside the cgroup root" in msg
    with pytest.raises(ConfigError):
        CgroupLayout.detect(node.cgroup_root).resolve_controllers()
    # a layout that was not checked at start keeps the link unresolved: every open through it is refused
    layout = CgroupLayout(node.cgroup_root)
    assert layout.subsystem_rel(BE, "cpu") == f"cpu/{BE}"


def test_relative_link_climbing_out_is_refused(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    (node.cgroup_root / "memory").rename(tmp_path / "memory")
    (node.cgroup_root / "memory").symlink_to("../../memory")
    dirs = resolve_controllers(node.cgroup_root)
    assert "memory" not in dirs.dirs
    assert "outside the cgroup root" in dirs.problems["memory"]


def test_a_dangling_controller_link_is_named(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    (node.cgroup_root / "cpuset").rename(tmp_path / "gone")
    (node.cgroup_root / "cpuset").symlink_to("cpuset-v1")
    with pytest.raises(ConfigError, match="cpuset -> cpuset-v1: No such file or directory"):
        check_host_roots(node.cgroup_root, node.proc_root, node.sys_root)


def _mountinfo(tmp_path: Path, root: Path, lines: list[tuple[str, str, str]]) -> str:
    """A mountinfo file naming `root`'s dirs as mounts: (dir, fstype, super options)."""
    text = "".join(
        f"{30 + i} 20 0:{40 + i} / {root / d} rw,nosuid - {fs} {fs} {opts}\n"
        for i, (d, fs, opts) in enumerate(lines)
    )
    text = f"20 1 0:20 / {root} rw - tmpfs tmpfs rw,mode=755\n" + text
    path = tmp_path / "mountinfo"
    path.write_text(text)
    return str(path)


def test_on_a_real_root_the_dir_must_be_a_mount_of_its_controller(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    root = node.cgroup_root
    good = _mountinfo(
        tmp_path,
        root,
        [
            ("cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
            ("memory", "cgroup", "rw,memory"),
            ("cpuset", "cgroup", "rw,cpuset"),
        ],
    )
    dirs = resolve_controllers(root, mountinfo=good)
    assert dirs.problems == {}
    assert dirs.dirs["cpu"] == "cpu,cpuacct"
    # systemd's cpu link pointing at the memory hierarchy: named, not used
    (root / "cpu").unlink()
    (root / "cpu").symlink_to("memory")
    dirs = resolve_controllers(root, mountinfo=good)
    assert "cpu" not in dirs.dirs
    assert dirs.problems["cpu"].endswith(f"a cgroup mount of memory ({root / 'memory'}), not of cpu")
    # a v1 controller's dir on the v2 mount
    v2 = _mountinfo(tmp_path, root, [("memory", "cgroup2", "rw,nsdelegate")])
    assert "cgroup v2 mount" in resolve_controllers(root, mountinfo=v2).problems["memory"]


def test_mountinfo_parsing() -> None:
    text = (
        "35 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup "
        "rw,cpu,cpuacct\n"
        "36 25 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "garbage line\n"
        "37 25 0:32 / /mnt/with\\040space rw - ext4 /dev/vda rw\n"
    )
    [cpu, unified, spaced] = parse_mountinfo(text)
    assert cpu.point == "/sys/fs/cgroup/cpu,cpuacct"
    assert cpu.fstype == "cgroup"
    assert {"cpu", "cpuacct"} <= cpu.super_options
    assert unified.fstype == "cgroup2"
    assert spaced.point == "/mnt/with space"


def test_this_machines_real_root_resolves_without_problems() -> None:
    root = Path("/sys/fs/cgroup")
    if not (root / "cpu").exists() or (root / "cgroup.controllers").exists():
        pytest.skip("no cgroup v1 hierarchy at /sys/fs/cgroup on this machine")
    dirs = resolve_controllers(root)  # reads only: lstat, readlink, mountinfo
    assert dirs.problems == {}
    assert dirs.dirs["cpu"] in ("cpu", "cpu,cpuacct")  # separate mounts here, systemd's pair elsewhere


async def test_a_changed_link_is_followed_and_caches_dropped(tmp_path: Path) -> None:
    """Resolved once at start, again when the link changes: the executor's cached paths and the reader's
    open files move to the new dir."""
    node = SyntheticNode(tmp_path / "node")
    root = node.cgroup_root
    layout = CgroupLayout.detect(root)
    layout.resolve_controllers()
    ex = CgroupExecutor(layout, DecisionLog())
    reader = CgroupReader(layout)
    [res] = await ex.apply("test", [CgroupWrite(BE, "cpu.shares", 2)])
    assert res.outcome is Outcome.WRITTEN
    node.add_cpu_usage(BE, 7)
    assert reader.cpu_usage_ns(BE) == 7
    assert layout.refresh_controllers() is False  # nothing changed: nothing dropped
    # the hierarchy is mounted again under another name and the links follow it
    os.rename(root / "cpu,cpuacct", root / "cpuacct,cpu")
    for link in ("cpu", "cpuacct"):
        (root / link).unlink()
        (root / link).symlink_to("cpuacct,cpu")
    (root / "cpuacct,cpu" / BE / "cpu.shares").write_text("1024\n")
    with capture_logs() as logs:
        assert layout.refresh_controllers() is True
    assert any(e["event"] == "cgroup controller directories changed" for e in logs)
    [res] = await ex.apply("test", [CgroupWrite(BE, "cpu.shares", 2)])  # the cache would have skipped it
    assert res.outcome is Outcome.WRITTEN
    assert (root / "cpuacct,cpu" / BE / "cpu.shares").read_text() == "2"
    node.add_cpu_usage(BE, 5)
    assert reader.cpu_usage_ns(BE) == 12


async def test_a_link_changed_to_leave_the_root_keeps_the_old_dir(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    root = node.cgroup_root
    layout = CgroupLayout.detect(root)
    layout.resolve_controllers()
    outside = tmp_path / "outside"
    (outside / BE).mkdir(parents=True)
    (outside / BE / "cpu.shares").write_text("1024\n")
    (root / "cpu").unlink()
    (root / "cpu").symlink_to(outside)
    with capture_logs() as logs:
        assert layout.refresh_controllers() is False
    assert any("refused target" in e["event"] for e in logs)
    ex = CgroupExecutor(layout, DecisionLog())
    [res] = await ex.apply("test", [CgroupWrite(BE, "cpu.shares", 2)])
    assert res.outcome is Outcome.WRITTEN
    assert (root / "cpu,cpuacct" / BE / "cpu.shares").read_text() == "2"
    assert (outside / BE / "cpu.shares").read_text() == "1024\n"


@pytest.mark.parametrize("shape", ["v1-systemd", "v1-separate", "hybrid", "v2"])
def test_node_shapes(tmp_path: Path, shape: str) -> None:
    kw: dict[str, object] = {
        "v1-systemd": {},
        "v1-separate": {"v1_mounts": V1Mounts.SEPARATE},
        "hybrid": {"hybrid": True},
        "v2": {"version": CgroupVersion.V2},
    }[shape]
    node = SyntheticNode(tmp_path, **kw)  # type: ignore[arg-type]
    assert node.describe() == shape
    layout = CgroupLayout.detect(node.cgroup_root)
    assert layout.version is node.version
    assert layout.hybrid is (shape == "hybrid")
    pod = layout.pod_dir_for("u1", KubeQoS.BESTEFFORT)
    node.make_cgroup(pod)
    expect = {"v1-separate": f"cpu/{pod}", "v2": pod}.get(shape, f"cpu,cpuacct/{pod}")
    assert layout.subsystem_rel(pod, "cpu") == expect
    assert (node.cgroup_root / expect).is_dir()
    assert not (node.cgroup_root / expect).is_symlink()


async def test_cpu_burst_caps_only_on_the_kernels_einval(tmp_path: Path) -> None:
    """A refused path (or any error but the kernel's EINVAL) is not "the kernel refused a burst above the
    quota": bursts stay uncapped. (The EINVAL case runs on the real kernel: test_cpuburst_real_v1.py.)"""
    from tests.strategies.cpuburst_builders import build_harness, ctr, make_pod, make_slo

    h = build_harness(tmp_path / "h")
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=1000)])
    pod_dir = h.add_pod(pod, pod_quota=100000, quotas={"c1": 100000})
    burst = h.node.cgroup_root / "cpu,cpuacct" / pod_dir / "c1" / "cpu.cfs_burst_us"
    burst.unlink()
    (tmp_path / "target").write_text("0\n")
    burst.symlink_to(tmp_path / "target")  # refused at the open
    h.metrics(node_cpu=1.0)
    with capture_logs() as logs:
        await h.run([pod], make_slo(policy="cpuBurstOnly", cpuBurstPercent=1000))
    refused = [d for d in h.decisions.recent(strategy=CPU_BURST) if d.action == "write-refused"]
    assert refused, "the symlinked burst file must be refused"
    assert not any("kernel refused a CFS burst" in e["event"] for e in logs)
    assert h.strategy._burst_capped_at_quota is False
    assert h.burst(pod_dir) == 1000000  # the pod's burst: the full percent, not capped at its quota
