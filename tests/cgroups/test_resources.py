"""Resource registry: validation, v2 conversions, semantic comparison, cpuset text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.cgroups.resources import (
    MAX_INT64,
    RESOURCES,
    CgroupVersion,
    Merge,
    format_cpuset,
    get_resource,
    merged_value,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    parse_cpuset,
    parse_current,
    render,
    same_value,
    shares_to_weight,
)
from koordqos.errors import CgroupError

V1, V2 = CgroupVersion.V1, CgroupVersion.V2


@pytest.mark.parametrize(("shares", "weight"), [(2, 1), (512, 20), (1024, 39), (262144, 10000)])
def test_shares_to_weight_spec_examples(shares: int, weight: int) -> None:
    assert shares_to_weight(shares) == weight


@pytest.mark.parametrize(("milli", "shares"), [(500, 512), (1000, 1024), (1, 2), (0, 2), (10**9, 262144)])
def test_milli_cpu_to_shares(milli: int, shares: int) -> None:
    assert milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(
    ("milli", "quota"), [(2000, 200000), (500, 50000), (1500, 150000), (5, 1000), (0, -1), (-1, -1)]
)
def test_milli_cpu_to_quota(milli: int, quota: int) -> None:
    assert milli_cpu_to_quota(milli) == quota


@pytest.mark.parametrize(
    ("name", "value", "version", "text"),
    [
        ("cpu.shares", 1024, V1, "1024"),
        ("cpu.shares", 1024, V2, "39"),
        ("cpu.cfs_quota_us", -1, V1, "-1"),
        ("cpu.cfs_quota_us", -1, V2, "max"),
        ("cpu.cfs_quota_us", 50000, V2, "50000"),
        ("cpu.cfs_burst_us", 10000, V2, "10000"),
        ("memory.limit_in_bytes", -1, V1, "-1"),
        ("memory.limit_in_bytes", -1, V2, "max"),
        ("memory.limit_in_bytes", 1 << 30, V2, "1073741824"),
        ("memory.high", MAX_INT64, V2, "max"),
        ("memory.high", -1, V1, str(MAX_INT64)),
        ("memory.min", 536870912, V2, "536870912"),
        ("cpuset.cpus", " 0-3,5 ", V1, "0-3,5"),
        ("cpu.idle", 1, V2, "1"),
        ("cpu.bvt_warp_ns", -1, V1, "-1"),
    ],
)
def test_render(name: str, value: int | str, version: CgroupVersion, text: str) -> None:
    assert render(get_resource(name), value, version) == text


def test_v2_period_keeps_current_quota() -> None:
    res = get_resource("cpu.cfs_period_us")
    assert render(res, 200000, V2, "50000 100000\n") == "50000 200000"
    assert render(res, 200000, V2, "max 100000") == "max 200000"
    assert render(res, 200000, V2, None) == "max 200000"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("cpu.shares", 1),
        ("cpu.shares", 262145),
        ("cpu.shares", "abc"),
        ("cpu.cfs_quota_us", 999),
        ("cpu.cfs_quota_us", -2),
        ("cpu.cfs_period_us", 999),
        ("cpu.cfs_burst_us", -1),
        ("cpu.cfs_burst_us", 100_000_001),
        ("cpu.idle", 2),
        ("cpu.bvt_warp_ns", 3),
        ("cpu.bvt_warp_ns", -2),
        ("cpuset.cpus", "0-"),
        ("cpuset.cpus", "3-1"),
        ("cpuset.cpus", 3),
        ("memory.limit_in_bytes", -5),
        ("memory.wmark_ratio", 101),
        ("memory.wmark_min_adj", -26),
        ("memory.wmark_min_adj", 51),
        ("memory.wmark_scale_factor", 0),
        ("memory.priority", 13),
        ("memory.oom.group", 2),
        ("blkio.cost.weight", 0),
        ("blkio.throttle.read_bps_device", "8:0 x"),
    ],
)
def test_invalid_values_rejected(name: str, value: int | str) -> None:
    with pytest.raises(CgroupError, match=name):
        render(get_resource(name), value, V1)


def test_unknown_resource() -> None:
    with pytest.raises(CgroupError, match="unknown cgroup resource"):
        get_resource("cpu.nonsense")


def test_v1_only_and_v2_only_files() -> None:
    # project decision (docs/configuration.md): v2 blkio throttles are io.max keys, the weight io.weight
    assert get_resource("blkio.cost.weight").file(V2) == "io.weight"
    assert get_resource("blkio.throttle.read_iops_device").file(V2) == "io.max"
    assert get_resource("net_cls.classid").file(V2) is None
    assert get_resource("memory.pagecache_limit.size").file(V1) is None
    assert get_resource("cpu.cfs_quota_us").file(V2) == "cpu.max"
    assert get_resource("memory.limit_in_bytes").file(V2) == "memory.max"
    assert get_resource("cpu.cfs_burst_us").file(V2) == "cpu.max.burst"


def test_mergeable_resources() -> None:
    merges = {n: r.merge for n, r in RESOURCES.items() if r.merge is not Merge.NONE}
    assert merges == {
        "cpu.cfs_quota_us": Merge.LARGER,
        "cpuset.cpus": Merge.LOOSER,
        "cpuset.mems": Merge.LOOSER,
        "memory.min": Merge.LARGER,
        "memory.low": Merge.LARGER,
        "memory.high": Merge.LARGER,
    }
    assert get_resource("memory.limit_in_bytes").blocking
    assert not get_resource("cpu.shares").blocking


@pytest.mark.parametrize(
    ("name", "version", "current", "new", "equal"),
    [
        ("cpuset.cpus", V1, "0,1,2,3\n", "0-3", True),
        ("cpuset.cpus", V1, "0-2", "0-3", False),
        ("cpu.cfs_quota_us", V2, "max 100000\n", "max", True),
        ("cpu.cfs_quota_us", V2, "50000 100000", "50000", True),
        ("cpu.cfs_quota_us", V2, "50000 100000", "max", False),
        ("memory.limit_in_bytes", V1, "9223372036854771712", "-1", True),
        ("memory.high", V2, "max", str(MAX_INT64), True),
        ("memory.high", V2, "max", "1024", False),
        ("cpu.shares", V1, "1024", "1024", True),
        ("cpu.shares", V1, "garbage", "1024", False),
    ],
)
def test_same_value(name: str, version: CgroupVersion, current: str, new: str, equal: bool) -> None:
    assert same_value(get_resource(name), version, current, new) is equal


def test_parse_current() -> None:
    assert parse_current(get_resource("cpu.cfs_quota_us"), V2, "max 100000") == -1
    assert parse_current(get_resource("cpu.cfs_quota_us"), V2, "20000 100000") == 20000
    assert parse_current(get_resource("cpu.cfs_period_us"), V2, "20000 50000") == 50000
    assert parse_current(get_resource("memory.limit_in_bytes"), V1, "9223372036854771712") == -1
    assert parse_current(get_resource("cpuset.cpus"), V1, "0-1\n") == "0-1"


def test_merged_value() -> None:
    quota = get_resource("cpu.cfs_quota_us")
    assert merged_value(quota, 50000, 80000) == 80000
    assert merged_value(quota, 80000, 50000) == 80000
    assert merged_value(quota, -1, 50000) == -1
    assert merged_value(quota, 50000, -1) == -1
    assert merged_value(get_resource("cpuset.cpus"), "0-1", "2") == "0-2"


@settings(max_examples=200, deadline=None)
@given(st.frozensets(st.integers(0, 255)))
def test_cpuset_roundtrip(cpus: frozenset[int]) -> None:
    assert parse_cpuset(format_cpuset(cpus)) == cpus


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 262144))
def test_weight_in_range(shares: int) -> None:
    w = shares_to_weight(shares)
    assert 1 <= w <= 10000
    assert render(get_resource("cpu.shares"), shares, V2) == str(w)
