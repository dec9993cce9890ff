"""koordlet's numbered CPUBurst test cases (docs/behaviour-qos-manager.md, "CPU burst")."""

from __future__ import annotations

import pytest

from koordqos.model.nodeslo import CPUBurstConfig, default_nodeslo
from koordqos.model.pod import PodInfo
from koordqos.strategies.cpuburst_limiter import BurstLimiter, LimiterPool
from koordqos.strategies.cpuburst_plan import (
    NodeBurstState,
    Operation,
    decide_quota,
    node_state_for_burst,
    plan_static_burst,
    pod_burst_config,
    static_burst_us,
)

from .cpuburst_builders import Harness, ctr, make_pod, make_slo, make_state

GiB = 1 << 30


def cfg(**kw: object) -> CPUBurstConfig:
    """A CPUBurstConfig from camelCase keys."""
    return CPUBurstConfig.model_validate(kw)


# -- 1. node state ------------------------------------------------------------------------------------------


def lsr_pod() -> PodInfo:
    return make_pod("lsr", [ctr("main", "lsr1", cpu_limit=8000, cpu_request=8000)], qos="LSR")


@pytest.mark.parametrize(
    ("lsr_usage", "expected", "ratio"),
    [
        (7.0, NodeBurstState.IDLE, 0.375),
        (5.0, NodeBurstState.OVERLOAD, 0.625),
        (6.25, NodeBurstState.COOLING, 0.46875),
    ],
)
def test_1_node_state_from_share_pool(lsr_usage: float, expected: NodeBurstState, ratio: float) -> None:
    state, pool = node_state_for_burst(50, 16, 10.0, [lsr_pod()], {"lsr": lsr_usage})
    assert state is expected
    assert pool is not None
    assert pool.total == 8
    assert pool.ratio == pytest.approx(ratio)


def test_1_node_state_unknown_without_node_metric_or_cpu_info() -> None:
    assert node_state_for_burst(50, 16, None, [lsr_pod()], {"lsr": 7.0})[0] is NodeBurstState.UNKNOWN
    assert node_state_for_burst(50, None, 10.0, [lsr_pod()], {"lsr": 7.0})[0] is NodeBurstState.UNKNOWN
    assert node_state_for_burst(50, 0, 10.0, [lsr_pod()], {"lsr": 7.0})[0] is NodeBurstState.UNKNOWN


def test_1_node_state_through_the_store_windows(harness: Harness) -> None:
    """The strategy averages node and pod usage over min(5 × interval, 10 s) = 5 s."""
    pods = [lsr_pod()]
    harness.now[0] = 990.0  # outside the window: ignored
    harness.metrics(node_cpu=16.0, pod_cpu={"lsr": 0.0})
    for t, node, lsr in ((996.0, 9.0, 7.5), (1000.0, 11.0, 6.5)):
        harness.now[0] = t
        harness.metrics(node_cpu=node, pod_cpu={"lsr": lsr})
    state = make_state(pods, make_slo(policy="auto"))
    got, pool = harness.strategy.node_state(state, harness.env)
    assert got is NodeBurstState.IDLE
    assert pool is not None
    assert pool.usage == pytest.approx(3.0)
    harness.env.topology = None
    assert harness.strategy.node_state(state, harness.env)[0] is NodeBurstState.UNKNOWN


# -- 2. static burst ----------------------------------------------------------------------------------------


def two_container_pod() -> PodInfo:
    return make_pod("p", [ctr("a", "ca", cpu_limit=5000), ctr("b", "cb", cpu_limit=3000)])


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"policy": "auto", "cpuBurstPercent": 1000}, (5_000_000, 3_000_000, 8_000_000)),
        ({"policy": "auto", "cpuBurstPercent": 500}, (2_500_000, 1_500_000, 4_000_000)),
        ({"policy": "cpuBurstOnly", "cpuBurstPercent": 1000}, (5_000_000, 3_000_000, 8_000_000)),
        ({"policy": "cfsQuotaBurstOnly", "cpuBurstPercent": 1000}, (0, 0, 0)),
        ({"policy": "none", "cpuBurstPercent": 1000}, (0, 0, 0)),
    ],
)
def test_2_static_burst_values(config: dict[str, object], expected: tuple[int, int, int]) -> None:
    plan = plan_static_burst(two_container_pod(), cfg(**config), lambda c: f"pod/{c.runtime_id}")
    assert plan.containers == (("pod/ca", expected[0]), ("pod/cb", expected[1]))
    assert plan.pod == expected[2]


def test_2_static_burst_without_limits_is_zero() -> None:
    pod = make_pod("p", [ctr("a", "ca"), ctr("b", "cb")])
    plan = plan_static_burst(pod, cfg(policy="auto", cpuBurstPercent=1000), lambda c: c.runtime_id)
    assert plan.containers == (("ca", 0), ("cb", 0))
    assert plan.pod == 0
    assert static_burst_us(0, cfg(policy="auto", cpuBurstPercent=1000)) == 0


async def test_2_static_burst_lands_in_pod_and_container_files(harness: Harness) -> None:
    pod = two_container_pod()
    pod_dir = harness.add_pod(pod)
    await harness.run([pod], make_slo(policy="auto", cpuBurstPercent=500))
    assert harness.burst(f"{pod_dir}/ca") == 2_500_000
    assert harness.burst(f"{pod_dir}/cb") == 1_500_000
    assert harness.burst(pod_dir) == 4_000_000


# -- 3. dynamic quota ---------------------------------------------------------------------------------------

# container limit 2 cores: base 200000, ceil 600000 at 300 %; throttled 0.5, usage 1.5 unless stated
DYNAMIC_CASES = [
    # id, policy, node state, cur, throttled, period, percent, operation, expected
    ("burst-only-reset", "cpuBurstOnly", NodeBurstState.IDLE, 400000, 0.5, -1, 300, Operation.RESET, 200000),
    ("cooling-remain", "auto", NodeBurstState.COOLING, 400000, 0.5, -1, 300, Operation.REMAIN, 400000),
    ("overload-clamped", "auto", NodeBurstState.OVERLOAD, 202000, 0.5, -1, 300, Operation.SCALE_DOWN, 200000),
    ("overload-down", "auto", NodeBurstState.OVERLOAD, 400000, 0.5, -1, 300, Operation.SCALE_DOWN, 320000),
    ("limiter-period-0", "auto", NodeBurstState.IDLE, 400000, 0.5, 0, 300, Operation.SCALE_DOWN, 320000),
    ("percent-90-ceil-base", "auto", NodeBurstState.IDLE, 400000, 0.5, -1, 90, Operation.SCALE_UP, 200000),
    ("not-throttled", "auto", NodeBurstState.IDLE, 580000, 0.0, -1, 300, Operation.REMAIN, 580000),
    ("throttled-ceil", "auto", NodeBurstState.IDLE, 580000, 0.5, -1, 300, Operation.SCALE_UP, 600000),
    ("idle-up", "auto", NodeBurstState.IDLE, 200000, 0.5, -1, 300, Operation.SCALE_UP, 240000),
]


@pytest.mark.parametrize(
    ("policy", "state", "cur", "throttled", "period", "percent", "op", "expected"),
    [c[1:] for c in DYNAMIC_CASES],
    ids=[c[0] for c in DYNAMIC_CASES],
)
def test_3_dynamic_quota_decision(
    policy: str,
    state: NodeBurstState,
    cur: int,
    throttled: float,
    period: int,
    percent: int,
    op: Operation,
    expected: int,
) -> None:
    config = cfg(policy=policy, cfsQuotaBurstPercent=percent, cfsQuotaBurstPeriodSeconds=period)
    got_op, target, _ = decide_quota(config, state, cur, 2000, throttled, 1.5, LimiterPool(), "c", 100.0)
    assert (got_op, target) == (op, expected)


# node usage on 16 CPUs that puts the (LS-only) node in each state at threshold 50 %
NODE_USAGE = {NodeBurstState.IDLE: 2.0, NodeBurstState.COOLING: 7.5, NodeBurstState.OVERLOAD: 10.0}


@pytest.mark.parametrize(
    ("policy", "state", "cur", "throttled", "period", "percent", "op", "expected"),
    [c[1:] for c in DYNAMIC_CASES],
    ids=[c[0] for c in DYNAMIC_CASES],
)
async def test_3_dynamic_quota_in_cgroup_files(
    harness: Harness,
    policy: str,
    state: NodeBurstState,
    cur: int,
    throttled: float,
    period: int,
    percent: int,
    op: Operation,
    expected: int,
) -> None:
    """The same cases through the strategy: the container's and the pod's quota move by the same delta."""
    pod = make_pod("p", [ctr("main", "c1", cpu_limit=2000)])
    pod_dir = harness.add_pod(pod, pod_quota=cur, quotas={"c1": cur})
    harness.metrics(node_cpu=NODE_USAGE[state], container_cpu={"c1": 1.5}, throttled={"c1": throttled})
    slo = make_slo(policy=policy, cfsQuotaBurstPercent=percent, cfsQuotaBurstPeriodSeconds=period)
    await harness.run([pod], slo)
    report = harness.strategy.last
    assert report is not None
    assert report.node_state is state
    assert [d.op for d in report.decisions] == [op]
    assert harness.quota(f"{pod_dir}/c1") == expected
    assert harness.quota(pod_dir) == expected


async def test_3_two_containers_scale_up_from_base(harness: Harness) -> None:
    pod = make_pod("p", [ctr("a", "c1", cpu_limit=2000), ctr("b", "c2", cpu_limit=3000)])
    pod_dir = harness.add_pod(pod, pod_quota=500000, quotas={"c1": 200000, "c2": 300000})
    harness.metrics(node_cpu=2.0, throttled={"c1": 0.5, "c2": 0.5})
    await harness.run([pod], make_slo(policy="auto"))
    assert harness.quota(f"{pod_dir}/c1") == 240000
    assert harness.quota(f"{pod_dir}/c2") == 360000
    assert harness.quota(pod_dir) == 600000


async def test_3_unlimited_pod_and_second_container_stay_unlimited(harness: Harness) -> None:
    pod = make_pod("p", [ctr("a", "c1", cpu_limit=2000), ctr("b", "c2")])
    pod_dir = harness.add_pod(pod, pod_quota=-1, quotas={"c1": 200000, "c2": -1})
    harness.metrics(node_cpu=2.0, throttled={"c1": 0.5, "c2": 0.5})
    await harness.run([pod], make_slo(policy="auto"))
    assert harness.quota(f"{pod_dir}/c1") == 240000
    assert harness.quota(f"{pod_dir}/c2") == -1
    assert harness.quota(pod_dir) == -1


# -- 4. limiter ---------------------------------------------------------------------------------------------


def limiter(capacity: int, tokens: int) -> BurstLimiter:
    return BurstLimiter(capacity, tokens, 0.0, 200.0)


@pytest.mark.parametrize(
    ("capacity", "tokens", "usage", "allowed", "after"),
    [
        (5000, 5000, 150, True, 4500),  # full bucket, 150 %: spend 50 × 10
        (5000, 50, 200, False, -950),  # spend 100 × 10
        (500, 5, 200, False, -500),  # floor at −capacity
        (5000, 500, 40, True, 1100),  # save 60 × 10
        (5000, 4500, 40, True, 5000),  # cap at capacity
        (5000, 100, 80, True, 100),  # 60 % ≤ usage < 100 %: unchanged
    ],
)
def test_4_limiter_allow(capacity: int, tokens: int, usage: int, allowed: bool, after: int) -> None:
    lim = limiter(capacity, tokens)
    assert lim.allow(10.0, usage) is allowed
    assert lim.tokens == after
    assert lim.last_update == 10.0


def test_4_limiter_capacity_and_random_initial_fill() -> None:
    lim = BurstLimiter.new(100, 150, 0.0, rand=lambda: 0.999)
    assert lim.capacity == 5000
    assert 0 <= lim.tokens < 2500
    assert lim.expire_seconds == 200
    assert BurstLimiter.new(10, 150, 0.0, rand=lambda: 0.0).capacity == 500


def test_4_limiter_reconfigured_when_capacity_changes() -> None:
    pool = LimiterPool(rand=lambda: 0.0)
    first = pool.get("c", 600, 300, 0.0)
    assert first.capacity == 120000
    assert pool.get("c", 600, 300, 1.0) is first
    second = pool.get("c", 300, 200, 2.0)
    assert second is not first
    assert second.capacity == 30000


def test_4_limiter_recycle() -> None:
    pool = LimiterPool(rand=lambda: 0.0)
    pool.get("old", 300, 200, 0.0)
    pool.get("recent", 300, 200, 20.0)
    assert pool.recycle(610.0) == ["old"]
    assert list(pool.limiters) == ["recent"]  # idle 590 s: kept


# -- 5. merge -----------------------------------------------------------------------------------------------


def test_5_pod_annotation_merged_over_node_config() -> None:
    node = make_slo(
        policy="auto", cpuBurstPercent=1000, cfsQuotaBurstPercent=300, cfsQuotaBurstPeriodSeconds=600
    ).cpu_burst_strategy
    pod = make_pod("p", [], burst={"policy": "cpuBurstOnly", "cpuBurstPercent": 500})
    merged = pod_burst_config(node, pod)
    assert merged is not None
    assert (
        merged.policy,
        merged.cpu_burst_percent,
        merged.cfs_quota_burst_percent,
        merged.cfs_quota_burst_period_seconds,
    ) == ("cpuBurstOnly", 500, 300, 600)


def test_5_grey_control_injection_over_default_node_config() -> None:
    node = default_nodeslo().cpu_burst_strategy

    def inject(pod: PodInfo) -> CPUBurstConfig | None:
        return cfg(policy="auto") if pod.namespace == "grey" else None

    merged = pod_burst_config(node, make_pod("p", [], namespace="grey"), [inject])
    assert merged is not None
    assert (
        merged.policy,
        merged.cpu_burst_percent,
        merged.cfs_quota_burst_percent,
        merged.cfs_quota_burst_period_seconds,
    ) == ("auto", 1000, 300, -1)
    other = pod_burst_config(node, make_pod("q", [], namespace="other"), [inject])
    assert other is not None
    assert other.policy == "none"
    # a pod's own annotation wins: no injection
    own = pod_burst_config(
        node, make_pod("r", [], namespace="grey", burst={"cpuBurstPercent": 200}), [inject]
    )
    assert own is not None
    assert (own.policy, own.cpu_burst_percent) == ("none", 200)


def test_5_bad_annotation_falls_back_to_node_config() -> None:
    node = make_slo(policy="auto", cpuBurstPercent=700).cpu_burst_strategy
    merged = pod_burst_config(node, make_pod("p", [], burst="{not json"))
    assert merged is not None
    assert (merged.policy, merged.cpu_burst_percent) == ("auto", 700)


# -- 6. a whole round ---------------------------------------------------------------------------------------


async def test_6_round_with_lsr_and_ls_pods(harness: Harness) -> None:
    lsr = make_pod("lsr", [ctr("main", "r1", cpu_limit=8000, cpu_request=8000)], qos="LSR")
    ls = make_pod("ls", [ctr("main", "s1", cpu_limit=1000, cpu_request=500)], qos="LS")
    lsr_dir = harness.add_pod(lsr, pod_quota=-1, quotas={"r1": -1})
    ls_dir = harness.add_pod(ls, pod_quota=200000, quotas={"s1": 200000})
    harness.metrics(
        node_cpu=10.0,
        pod_cpu={"lsr": 7.0, "ls": 0.2},
        container_cpu={"r1": 7.0, "s1": 0.2},
        throttled={"r1": 0.5, "s1": 0.5},
    )
    await harness.run([lsr, ls], make_slo(policy="auto"))
    report = harness.strategy.last
    assert report is not None
    assert report.node_state is NodeBurstState.IDLE
    assert report.pool is not None
    assert report.pool.ratio == pytest.approx(3 / 8)
    # LSR untouched
    assert harness.burst(lsr_dir) == 0
    assert harness.burst(f"{lsr_dir}/r1") == 0
    assert harness.quota(lsr_dir) == -1
    assert harness.quota(f"{lsr_dir}/r1") == -1
    # LS: base 100000, ceil 300000, current 200000, throttled → ×1.2
    assert harness.burst(ls_dir) == 1_000_000
    assert harness.burst(f"{ls_dir}/s1") == 1_000_000
    assert harness.quota(ls_dir) == 240000
    assert harness.quota(f"{ls_dir}/s1") == 240000
