"""What CPU burst needs of the collector (`--container-metrics=needed`): `reads_container_cpu` and the agent's
`container_demand`.

The predicate is checked against the strategy itself: for each case the same rounds run on two fresh nodes,
one whose store has the container's CPU usage and throttling and one without them. The outcome (the quota
written, the burst limiter's tokens) differs exactly when the predicate says the series are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from koordqos.agent import container_demand
from koordqos.config import AgentConfig
from koordqos.metrics.types import ContainerSeries
from koordqos.model.nodeslo import NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.strategies.cpuburst import FULL_PASS_SECONDS
from koordqos.strategies.cpuburst_plan import reads_container_cpu

from .cpuburst_builders import build_harness, ctr, make_pod, make_slo, make_state

BASE = 200_000  # 2-core limit
LIMITER = {"cfsQuotaBurstPeriodSeconds": 60, "cfsQuotaBurstPercent": 300}


def pod(limit: int = 2000, qos: str | None = "LS", burst: dict[str, Any] | None = None, **kw: Any) -> PodInfo:
    return make_pod("p1", [ctr("main", "c1", cpu_limit=limit, cpu_request=1000)], qos=qos, burst=burst, **kw)


# (case id, pod, NodeSLO or None)
CASES: list[tuple[str, PodInfo, NodeSLO | None]] = [
    ("no-nodeslo", pod(), None),
    ("policy-none", pod(), make_slo(policy="none")),
    ("auto", pod(), make_slo(policy="auto")),
    ("cfsQuotaBurstOnly", pod(), make_slo(policy="cfsQuotaBurstOnly")),
    ("cpuBurstOnly", pod(), make_slo(policy="cpuBurstOnly")),
    ("none-with-limiter", pod(), make_slo(policy="none", **LIMITER)),
    ("cpuBurstOnly-with-limiter", pod(), make_slo(policy="cpuBurstOnly", **LIMITER)),
    ("pod-annotation-auto", pod(burst={"policy": "auto"}), make_slo(policy="none")),
    ("pod-annotation-none", pod(burst={"policy": "none"}), make_slo(policy="auto")),
    ("no-cpu-limit", pod(limit=0), make_slo(policy="auto")),
    ("lsr-pod", pod(qos="LSR", kube_qos=KubeQoS.GUARANTEED), make_slo(policy="auto")),
    ("be-pod", pod(qos="BE", kube_qos=KubeQoS.BESTEFFORT), make_slo(policy="auto")),
    ("succeeded", pod(phase="Succeeded"), make_slo(policy="auto")),
]


async def outcome(base: Path, p: PodInfo, slo: NodeSLO | None, with_series: bool) -> tuple[int, Any]:
    """Strategy rounds on an idle node, the last one a full pass (a pod without a dynamic policy is visited
    again only then); the container's quota and its limiter tokens afterwards."""
    h = build_harness(base)
    pod_dir = h.add_pod(p, pod_quota=BASE, quotas={"c1": BASE})
    for step in (1.0, 1.0, 1.0, FULL_PASS_SECONDS):
        h.now[0] += step
        h.metrics(node_cpu=1.0, pod_cpu={"p1": 0.2})
        if with_series:  # throttled half the periods, using 0.2 of its 2 cores (the limiter saves tokens)
            h.metrics(container_cpu={"c1": 0.2}, throttled={"c1": 0.5})
        await h.run([p], slo)
    lim = h.strategy.limiters.limiters.get("containerd://c1")
    return h.quota(f"{pod_dir}/c1"), None if lim is None else lim.tokens


@pytest.mark.parametrize(("case", "p", "slo"), CASES, ids=[c[0] for c in CASES])
async def test_the_series_change_the_outcome_exactly_when_the_predicate_says_so(
    tmp_path: Path, case: str, p: PodInfo, slo: NodeSLO | None
) -> None:
    needed = reads_container_cpu(p, slo.cpu_burst_strategy if slo is not None else None)
    with_series = await outcome(tmp_path / "with", p, slo, True)
    without = await outcome(tmp_path / "without", p, slo, False)
    assert (with_series != without) is needed, (with_series, without)


def test_the_predicate_per_case() -> None:
    """The expected answers, spelled out (the test above proves each against the strategy)."""
    got = {c: reads_container_cpu(p, s.cpu_burst_strategy if s else None) for c, p, s in CASES}
    wanted = {
        "auto",
        "cfsQuotaBurstOnly",
        "none-with-limiter",
        "cpuBurstOnly-with-limiter",
        "pod-annotation-auto",
    }
    assert {c for c, v in got.items() if v} == wanted


def config(**kw: Any) -> AgentConfig:
    return AgentConfig.model_validate(kw)


def test_agent_demand_follows_the_flag_the_gate_and_the_policy() -> None:
    p = pod()
    auto = make_state([p], make_slo(policy="auto"))
    none = make_state([p], make_slo(policy="none"))
    annotated = pod(burst={"policy": "auto"})

    assert container_demand(config(metrics={"container_metrics": "all"}), True) is None  # every container

    needed = container_demand(config(), True)  # the default
    assert needed is not None
    assert needed(p, auto) is ContainerSeries.CPU
    assert needed(p, none) is ContainerSeries.NONE
    assert needed(annotated, make_state([annotated], make_slo(policy="none"))) is ContainerSeries.CPU
    assert needed(p, make_state([p], None)) is ContainerSeries.NONE

    # CPU burst not running: nothing is needed, whatever the policy
    for off in (
        container_demand(config(), False),  # the strategies package is not built
        container_demand(config(feature_gates="CPUBurst=false"), True),
        container_demand(config(qos={"reconcile_interval_seconds": 0}), True),
    ):
        assert off is not None
        assert off(p, auto) is ContainerSeries.NONE
