"""CPU suppress under a steady load at every interval from 0.1 s to 1 s: koordlet's last-sample planner
swings, the project's smoothing + hysteresis (docs/cpu-suppress-stability.md) settles.

The node is simulated the way the kernel accounts it: pod usage from cgroup counters is exact (plus the
probes' own slot-to-slot jitter), node usage from /proc/stat is tick-sampled (CONFIG_HZ 250: each tick
charges a whole 4 ms to whatever runs, so a CPU busy a fraction f of the time is charged a binomial number
of ticks) and shown in USER_HZ (10 ms) units. BE takes what its quota and the node leave it, so every
quota the planner writes feeds back into the next sample, as on a real node.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

import pytest

from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.pod import KubeQoS
from koordqos.strategies.cpupick import Processor
from koordqos.strategies.cpusuppress import CPUSuppress
from koordqos.strategies.intents import CFS_QUOTA, BEDir
from koordqos.strategies.suppressplan import Policy, SuppressConfig, SuppressInputs
from koordqos.strategies.suppresssmoothing import (
    DEFAULT_HYSTERESIS_PERCENT,
    DEFAULT_USAGE_WINDOW_SECONDS,
    suppress_usage,
    window_samples,
)

from .conftest import make_node, make_pod

CPUS = 2
HZ = 250
USER_HZ = 100
SYSTEM = 0.05  # cores of non-pod work
BE_DIRS = (BEDir("kubepods/besteffort", 0),)
INTERVALS = (0.1, 0.2, 0.5, 1.0)


@dataclass
class SteadyNode:
    """A 2-CPU node with a steady LS pod and a BE pod that wants `be_demand` cores."""

    ls: float
    be_demand: float = 2.0
    seed: int = 1
    rng: random.Random = field(init=False)
    ticks: float = 0.0  # cumulative busy ticks (CONFIG_HZ), as the kernel keeps them

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def sample(self, interval: float, quota: int) -> tuple[float, float, float]:
        """(node usage as the collector computes it from /proc/stat, LS usage, BE usage) for one interval."""
        ls = max(0.0, self.ls + self.rng.uniform(-0.03, 0.03))
        cap = quota / 100_000 if quota > 0 else float("inf")
        be = max(0.0, min(self.be_demand, cap, CPUS - ls - SYSTEM))
        busy_fraction = (ls + be + SYSTEM) / CPUS
        ticks = CPUS * round(interval * HZ)
        charged = sum(self.rng.random() < busy_fraction for _ in range(ticks))
        shown_before = int(self.ticks * USER_HZ / HZ)  # /proc/stat truncates to USER_HZ units
        self.ticks += charged
        shown_after = int(self.ticks * USER_HZ / HZ)
        return (shown_after - shown_before) / USER_HZ / interval, ls, be


@dataclass
class Run:
    quotas: list[int]  # after each round
    writes: list[tuple[float, int]]  # (time, value)

    def settled(self, after: float, interval: float) -> list[int]:
        return self.quotas[int(after / interval) :]

    def writes_per_window(self, start: float, end: float, window: float = 10.0) -> list[int]:
        counts = []
        t = start
        while t + window <= end + 1e-9:
            counts.append(sum(1 for w, _ in self.writes if t <= w < t + window))
            t += window
        return counts


def simulate(
    interval: float,
    window_s: float,
    hysteresis: float,
    ls: float,
    seconds: float = 60.0,
    seed: int = 1,
    start_quota: int = -1,
) -> Run:
    """Rounds of the CPU-suppress planner (cfsQuota, threshold 65) against the simulated node."""
    now = [0.0]
    store = MetricStore(600, interval, clock=lambda: now[0])
    node_sim = SteadyNode(ls, seed=seed)
    pods = {
        "ls": make_pod("ls", "LS", kube_qos=KubeQoS.BURSTABLE),
        "be": make_pod("be", "BE"),
    }
    node = make_node(cpu_cores=CPUS)
    processors = [Processor(i, i, 0, 0) for i in range(CPUS)]
    samples = window_samples(window_s, interval)
    core = CPUSuppress()
    quota = start_quota
    run = Run([], [])
    for k in range(1, round(seconds / interval) + 1):
        now[0] = k * interval
        node_used, ls_used, be_used = node_sim.sample(interval, quota)
        store.add(MetricKind.NODE_CPU_USAGE, "", node_used, now[0])
        store.add(MetricKind.POD_CPU_USAGE, "ls", ls_used, now[0])
        store.add(MetricKind.POD_CPU_USAGE, "be", be_used, now[0])
        node_in, pod_in = suppress_usage(store, pods, samples)
        plan = core.plan(
            SuppressInputs(
                config=SuppressConfig(enable=True, threshold_percent=65, policy=Policy.CFS_QUOTA),
                pods=pods,
                node=node,
                node_used=node_in,
                pod_used=pod_in,
                host_app_used={},
                processors=processors,
                be_quota=quota,
                be_cpuset=tuple(range(CPUS)),
                be_dirs=BE_DIRS,
                hysteresis_percent=hysteresis,
            )
        )
        for w in plan.writes:
            if w.resource == CFS_QUOTA:
                quota = int(w.value)
                run.writes.append((now[0], quota))
        run.quotas.append(quota)
    return run


# -- the swing, reproduced -----------------------------------------------------------------------------------


def test_koordlet_last_sample_planner_swings_at_short_intervals() -> None:
    """The issue's workload (3 probes = 1.2 cores of 2; the target is ~0.05 cores): at 0.1 s the quota jumps
    between the 2000 floor and several times the target, with a write in most rounds."""
    run = simulate(0.1, window_s=0, hysteresis=0, ls=1.2)
    steady = run.settled(10.0, 0.1)
    assert min(steady) == 2000
    assert max(steady) >= 10_000  # 5× the floor, 2× the ~5000 µs target: the saw-tooth
    assert min(run.writes_per_window(10.0, 60.0)) >= 20  # 20+ writes per steady 10 s


def test_koordlet_planner_writes_every_few_rounds_even_at_1s() -> None:
    """Mid-range target (LS 0.6 → ~0.65 cores for BE): koordlet's 1 % bypass lets the jitter through."""
    run = simulate(1.0, window_s=0, hysteresis=0, ls=0.6)
    assert max(run.writes_per_window(10.0, 60.0)) > 2


# -- and gone ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("ls", [1.2, 0.6, 0.3], ids=["issue-load", "mid-range", "light"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_smoothed_planner_settles_at_every_interval(interval: float, ls: float, seed: int) -> None:
    run = simulate(
        interval, DEFAULT_USAGE_WINDOW_SECONDS, DEFAULT_HYSTERESIS_PERCENT, ls=ls, seconds=70.0, seed=seed
    )
    steady = run.settled(10.0, interval)
    center = statistics.median(steady)
    # within ±10 % of the settled value (or the 1 % bypass of the node, 2000 µs, for a tiny quota)
    tolerance = max(0.1 * center, 2000)
    assert all(abs(q - center) <= tolerance for q in steady), (min(steady), center, max(steady))
    assert max(run.writes_per_window(10.0, 70.0)) <= 2, run.writes
    # it settled near koordlet's formula: 2 × 0.65 − LS − system
    expected = max((CPUS * 0.65 - ls - SYSTEM) * 100_000, 2000)
    assert abs(center - expected) <= 0.06 * CPUS * 100_000


def test_smoothed_planner_still_cuts_an_ls_surge_in_one_round() -> None:
    """Pod usage is not smoothed: when LS jumps, the cut lands in the same round."""
    now = [0.0]
    store = MetricStore(600, 0.1, clock=lambda: now[0])
    pods = {"ls": make_pod("ls", "LS", kube_qos=KubeQoS.BURSTABLE), "be": make_pod("be", "BE")}
    samples = window_samples(DEFAULT_USAGE_WINDOW_SECONDS, 0.1)
    for k in range(1, 21):  # 2 s steady: LS 0.3, BE 0.5, system 0.05
        now[0] = k * 0.1
        store.add(MetricKind.NODE_CPU_USAGE, "", 0.85, now[0])
        store.add(MetricKind.POD_CPU_USAGE, "ls", 0.3, now[0])
        store.add(MetricKind.POD_CPU_USAGE, "be", 0.5, now[0])
    now[0] += 0.1  # LS jumps to 1.1 cores
    store.add(MetricKind.NODE_CPU_USAGE, "", 1.65, now[0])
    store.add(MetricKind.POD_CPU_USAGE, "ls", 1.1, now[0])
    store.add(MetricKind.POD_CPU_USAGE, "be", 0.5, now[0])
    node_in, pod_in = suppress_usage(store, pods, samples)
    core = CPUSuppress()
    plan = core.plan(
        SuppressInputs(
            config=SuppressConfig(enable=True, threshold_percent=65, policy=Policy.CFS_QUOTA),
            pods=pods,
            node=make_node(cpu_cores=CPUS),
            node_used=node_in,
            pod_used=pod_in,
            host_app_used={},
            processors=[Processor(i, i, 0, 0) for i in range(CPUS)],
            be_quota=95_000,  # the cap before the surge: 1.3 − 0.3 − 0.05
            be_cpuset=(0, 1),
            be_dirs=BE_DIRS,
            hysteresis_percent=DEFAULT_HYSTERESIS_PERCENT,
        )
    )
    [write] = [w for w in plan.writes if w.resource == CFS_QUOTA]
    assert int(write.value) == pytest.approx(15_000, abs=200)  # 1.3 − 1.1 − 0.05 (system unchanged)


def test_recovery_is_still_step_limited_to_10_percent() -> None:
    """LS falls from 1.2 to 0.3 cores: BE grows back in steps of at most 10 % of capacity (20000 µs)."""
    run = simulate(0.1, DEFAULT_USAGE_WINDOW_SECONDS, DEFAULT_HYSTERESIS_PERCENT, ls=1.2, seconds=20.0)
    low = run.quotas[-1]
    after = _continue(run, ls=0.3)
    steps = [b - a for a, b in zip([low, *after], after, strict=False) if b != a]
    assert steps
    assert max(steps) <= 20_000
    assert after[-1] >= 85_000  # reached ~1.3 − 0.3 − 0.05 = 0.95 cores (within the band)


def _continue(run: Run, ls: float) -> list[int]:
    """Quotas of 20 more seconds at 0.1 s after the load changed (a fresh planner from the last quota)."""
    rerun = simulate(
        0.1,
        DEFAULT_USAGE_WINDOW_SECONDS,
        DEFAULT_HYSTERESIS_PERCENT,
        ls=ls,
        seconds=20.0,
        start_quota=run.quotas[-1],
    )
    return rerun.quotas


def test_one_sample_window_is_koordlets_last_sample() -> None:
    """At koordlet's 1 s interval the 1 s window holds one sample: the inputs are exactly the last ones."""
    now = [10.0]
    store = MetricStore(600, 1.0, clock=lambda: now[0])
    for t, node, ls in ((8.0, 1.0, 0.2), (9.0, 1.4, 0.4), (10.0, 0.9, 0.3)):
        store.add(MetricKind.NODE_CPU_USAGE, "", node, t)
        store.add(MetricKind.POD_CPU_USAGE, "ls", ls, t)
    node_in, pod_in = suppress_usage(store, ["ls"], window_samples(1.0, 1.0))
    assert node_in == 0.9
    assert pod_in == {"ls": 0.3}
    # with a 3 s window only the non-pod part is averaged: mean(node) − mean(ls) + last(ls)
    node3, _ = suppress_usage(store, ["ls"], window_samples(3.0, 1.0))
    assert node3 == pytest.approx((1.0 + 1.4 + 0.9) / 3 - (0.2 + 0.4 + 0.3) / 3 + 0.3)


def test_hysteresis_runs_a_step_limited_recovery_to_its_target() -> None:
    """A move that started outside the band is not left short of the target by the 10 % step limit."""
    from koordqos.strategies.suppresssmoothing import QuotaHysteresis

    h = QuotaHysteresis(percent=5.0)  # band 10000 µs on 2 CPUs
    assert h.decide(None, 100_000, 100_000, 2000) is None
    assert h.decide(105_000, 105_000, 100_000, 2000) is None  # inside the band: held
    assert h.decide(40_000, 40_000, 100_000, 2000) == 40_000  # a cut beyond it: at once
    assert h.decide(60_000, 65_000, 40_000, 2000) == 60_000  # recovery, step-limited (moving)
    assert h.decide(65_000, 65_000, 60_000, 2000) == 65_000  # 5000 < band, but the move finishes
    assert h.decide(67_000, 67_000, 65_000, 2000) is None  # settled: held again
    assert h.decide(50_000, 50_000, -1, 2000) == 50_000  # from unlimited: always


def test_a_newly_measured_pod_does_not_leave_its_usage_as_system_usage() -> None:
    """BE ran 2 s unmeasured (its usage was "system" then); once measured, the window starts afresh."""
    now = [0.0]
    store = MetricStore(600, 0.1, clock=lambda: now[0])
    for k in range(1, 21):
        now[0] = k * 0.1
        store.add(MetricKind.NODE_CPU_USAGE, "", 1.35, now[0])  # LS 0.3 + BE 1.0 + system 0.05
        store.add(MetricKind.POD_CPU_USAGE, "ls", 0.3, now[0])
    now[0] += 0.1
    store.add(MetricKind.NODE_CPU_USAGE, "", 1.35, now[0])
    store.add(MetricKind.POD_CPU_USAGE, "ls", 0.3, now[0])
    store.add(MetricKind.POD_CPU_USAGE, "be", 1.0, now[0])  # first sample of BE
    node_in, pod_in = suppress_usage(store, ["ls", "be"], window_samples(DEFAULT_USAGE_WINDOW_SECONDS, 0.1))
    assert node_in is not None
    assert node_in - sum(pod_in.values()) == pytest.approx(0.05)  # system, not 1.05
