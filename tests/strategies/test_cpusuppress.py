"""CPU suppress: koordlet's test cases 1–15 (same inputs, same outputs; docs/behaviour-qos-manager.md,
"CPU suppress")."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from koordqos.cgroups.executor import CgroupWrite
from koordqos.model.node import NodeInfo
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.strategies.cpupick import Processor, pick_be_cpus
from koordqos.strategies.cpusuppress import CPUSuppress
from koordqos.strategies.intents import CFS_QUOTA, CPUSET_CPUS, BEDir
from koordqos.strategies.suppressplan import (
    HostApp,
    Policy,
    Status,
    SuppressConfig,
    SuppressInputs,
    be_suppress_milli,
    plan_cfs_quota,
)
from koordqos.strategies.usage import calculate_filter_pods_used, non_be_host_app, non_be_pod

from .conftest import make_node, make_pod

BE = "kubepods/besteffort"
POD = f"{BE}/podbe"
CTR = f"{POD}/ctr1"
SANDBOX = f"{POD}/sandbox"
BE_DIRS = (BEDir(BE, 0), BEDir(POD, 1), BEDir(CTR, 2), BEDir(SANDBOX, 2))


def ls_pod(name: str = "ls", **kw: object) -> PodInfo:
    return make_pod(name, "LS", kube_qos=KubeQoS.BURSTABLE, **kw)  # type: ignore[arg-type]


def be_pod(name: str = "be", **kw: object) -> PodInfo:
    return make_pod(name, "BE", **kw)  # type: ignore[arg-type]


def suppress(
    capacity: float,
    threshold: int,
    node_used: float,
    pods: Sequence[PodInfo],
    used: dict[str, float],
    apps: Sequence[HostApp] = (),
    app_used: dict[str, float] | None = None,
    min_percent: int | None = None,
) -> int:
    split = calculate_filter_pods_used(
        node_used,
        0,
        {p.uid: p for p in pods},
        used,
        apps,
        app_used or {},
        non_be_pod,
        lambda a: a.non_be,
        lambda a: a.name,
    )
    return be_suppress_milli(int(capacity * 1000), threshold, *split, min_percent=min_percent)


# -- 1–4: the calculator -------------------------------------------------------------------------------------


def test_case1_calculator() -> None:
    assert suppress(20, 70, 12, [ls_pod(), be_pod()], {"ls": 8, "be": 2}) == 4000


def test_case2_host_apps() -> None:
    pods = [ls_pod(), be_pod()]
    assert suppress(20, 70, 12, pods, {"ls": 8, "be": 2}, [HostApp("app", True)], {"app": 1}) == 4000
    assert suppress(20, 70, 12, pods, {"ls": 8, "be": 2}, [HostApp("app", False)], {"app": 1}) == 5000


def test_case2_be_host_app_filter_uses_besteffort_base() -> None:
    from koordqos.model.nodeslo import HostApplicationSpec

    be_app = HostApplicationSpec.model_validate(
        {"name": "a", "qos": "BE", "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "a"}}
    )
    be_app_root = HostApplicationSpec.model_validate({"name": "b", "qos": "BE"})
    ls_app = HostApplicationSpec.model_validate({"name": "c", "qos": "LS"})
    assert not non_be_host_app(be_app)
    assert non_be_host_app(be_app_root)
    assert non_be_host_app(ls_app)


def test_case3_min_percent() -> None:
    assert suppress(20, 70, 12, [ls_pod(), be_pod()], {"ls": 8, "be": 2}, min_percent=60) == 12000


def test_case4_unknown_pod_counts_as_non_be() -> None:
    assert suppress(20, 70, 11, [be_pod()], {"unknown": 8, "be": 4}) == 6000
    assert calculate_filter_pods_used(0, 0, {}, {}, [], {}, non_be_pod, bool, str) == (0, 0, 0)


def test_usage_split_spec_examples() -> None:
    # koordlet's three usage-split examples (docs/behaviour-qos-manager.md, "Usage split")
    assert calculate_filter_pods_used(10, 0, {}, {}, [], {}, non_be_pod, bool, str) == (0, 0, 10)
    pods = {"ls": ls_pod(), "be": be_pod()}
    apps = [HostApp("ls-app", True), HostApp("be-app", False)]
    got = calculate_filter_pods_used(
        80,
        8,
        pods,
        {"ls": 20, "be": 32},
        apps,
        {"ls-app": 4, "be-app": 8},
        non_be_pod,
        lambda a: a.non_be,
        lambda a: a.name,
    )
    assert got == (20, 4, 16)
    from koordqos.strategies.usage import not_batch_or_free_pod

    got = calculate_filter_pods_used(
        80, 8, pods, {"ls": 20, "be": 32}, [], {}, not_batch_or_free_pod, bool, str
    )
    assert got == (20, 0, 28)


# -- topology helpers ----------------------------------------------------------------------------------------


def sixteen_cpus() -> list[Processor]:
    """4 buckets of 4 (node0/socket0 0-3, node0/socket1 4-7, node1/socket2 8-11, node1/socket3 12-15)."""
    return [Processor(c, c // 2, c // 4, c // 8) for c in range(16)]


def eight_cpus_two_nodes() -> list[Processor]:
    """Pairs (0,1),(2,3) on node0/socket0 and (4,5),(6,7) on node1/socket1."""
    return [Processor(c, c // 2, c // 4, c // 4) for c in range(8)]


def inputs(
    *,
    policy: Policy = Policy.CFS_QUOTA,
    enable: bool | None = True,
    pods: Sequence[PodInfo] = (),
    node: NodeInfo | None = None,
    node_used: float | None = 12,
    used: dict[str, float] | None = None,
    processors: Sequence[Processor] | None = None,
    quota: int | None = -1,
    cpuset: tuple[int, ...] | None = None,
    reserved: frozenset[int] = frozenset(),
    sysqos: frozenset[int] = frozenset(),
    kubelet_policy: str = "",
    be_cpu_manager: bool = False,
) -> SuppressInputs:
    return SuppressInputs(
        config=SuppressConfig(enable=enable, threshold_percent=70, policy=policy),
        pods={p.uid: p for p in pods},
        node=node if node is not None else make_node(16),
        node_used=node_used,
        pod_used=used or {},
        host_app_used={},
        processors=processors if processors is not None else sixteen_cpus(),
        be_quota=quota,
        be_cpuset=cpuset,
        be_dirs=BE_DIRS,
        pod_dirs={"be": POD},
        reserved_cpus=reserved,
        system_qos_exclusive=sysqos,
        cpu_manager_policy=kubelet_policy,
        be_cpu_manager=be_cpu_manager,
    )


def values(writes: list[CgroupWrite], resource: str) -> dict[str, str]:
    """The final value per dir of `resource` after the writes in order."""
    out: dict[str, str] = {}
    for w in writes:
        if w.resource == resource:
            out[w.parent] = str(w.value)
    return out


# -- 5–9: the full loop --------------------------------------------------------------------------------------


def test_case5_cfs_quota_policy() -> None:
    s = CPUSuppress()
    plan = s.plan(inputs(pods=[ls_pod(), be_pod()], used={"ls": 8, "be": 2}, quota=1_500_000))
    assert plan.suppress_milli == 1200
    assert values(plan.writes, CFS_QUOTA) == {BE: "120000"}
    assert values(plan.writes, CPUSET_CPUS) == {BE: "0-15", POD: "0-15", CTR: "0-15", SANDBOX: "0-15"}
    assert s.statuses == {Policy.CFS_QUOTA: Status.USING, Policy.CPUSET: Status.RECOVERED}


def test_case6_only_informer_pods_are_counted() -> None:
    s = CPUSuppress()
    plan = s.plan(inputs(pods=[be_pod()], used={"be": 4}, quota=1_000_000))
    assert values(plan.writes, CFS_QUOTA) == {BE: "320000"}


def test_case7_cpuset_policy() -> None:
    s = CPUSuppress()
    plan = s.plan(
        inputs(
            policy=Policy.CPUSET,
            pods=[ls_pod(), be_pod()],
            used={"ls": 8, "be": 2},
            cpuset=tuple(range(10)),
            quota=1_500_000,
        )
    )
    cpusets = values(plan.writes, CPUSET_CPUS)
    assert cpusets[BE] == "0-1"
    assert cpusets[POD] == "0-1"
    assert values(plan.writes, CFS_QUOTA) == {BE: "-1"}
    assert s.statuses == {Policy.CPUSET: Status.USING, Policy.CFS_QUOTA: Status.RECOVERED}
    # loosen top-down to old ∪ new first, then the exact set bottom-up
    first = [w for w in plan.writes if w.resource == CPUSET_CPUS]
    assert first[0].parent == BE
    assert first[0].value == "0-9"
    assert first[-1].parent == BE
    assert first[-1].value == "0-1"


def test_case8_disabled_recovers_both() -> None:
    s = CPUSuppress()
    s.statuses[Policy.CFS_QUOTA] = Status.USING
    plan = s.plan(inputs(enable=False, pods=[be_pod()], quota=120000, cpuset=(0, 1)))
    assert values(plan.writes, CFS_QUOTA) == {BE: "-1"}
    assert set(values(plan.writes, CPUSET_CPUS).values()) == {"0-15"}
    assert s.statuses == {Policy.CFS_QUOTA: Status.RECOVERED, Policy.CPUSET: Status.RECOVERED}


def test_enable_missing_skips_without_recovery() -> None:
    plan = CPUSuppress().plan(inputs(enable=None, pods=[be_pod()]))
    assert plan.writes == []
    assert plan.skipped


def test_case9_be_cpu_manager_keeps_numa_bound_containers() -> None:
    bound = be_pod(
        annotations={
            "scheduling.koordinator.sh/resource-status": json.dumps({"numaNodeResources": [{"node": 0}]})
        }
    )
    plan = CPUSuppress().plan(inputs(pods=[bound], be_cpu_manager=True))
    assert values(plan.writes, CFS_QUOTA) == {BE: "-1"}
    assert values(plan.writes, CPUSET_CPUS) == {BE: "0-15", POD: "0-15"}  # container + sandbox untouched


def test_be_cpu_manager_without_binding_recovers_containers() -> None:
    plan = CPUSuppress().plan(inputs(pods=[be_pod()], be_cpu_manager=True))
    assert values(plan.writes, CPUSET_CPUS) == {BE: "0-15", POD: "0-15", CTR: "0-15", SANDBOX: "0-15"}


# -- 10: adjustByCfsQuota ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target_milli", "current", "expected"),
    [
        (20000, 1_000_000, 1_800_000),
        (20000, 1_900_000, 2_000_000),
        (20000, 2_400_000, 2_000_000),
        (20000, 1_980_000, None),
        (1, 80_000, 2000),
        (20000, -1, 2_000_000),
    ],
)
def test_case10_adjust_by_cfs_quota(target_milli: int, current: int, expected: int | None) -> None:
    assert plan_cfs_quota(target_milli, current, 80_000) == expected


def test_negative_suppress_is_floored_at_min_quota() -> None:
    assert plan_cfs_quota(-3000, 500_000, 16_000) == 2000


# -- 11: the picking policy ----------------------------------------------------------------------------------


def test_case11_picking() -> None:
    spread = [
        Processor(0, 0, 0, 0),
        Processor(1, 1, 0, 0),
        Processor(2, 2, 1, 1),
        Processor(3, 3, 1, 1),
        Processor(4, 0, 0, 0),
        Processor(5, 1, 0, 0),
        Processor(6, 2, 1, 1),
        Processor(7, 3, 1, 1),
    ]
    assert pick_be_cpus(3, spread) == [0, 4, 2]
    assert pick_be_cpus(3, eight_cpus_two_nodes()) == [0, 1, 4]
    assert pick_be_cpus(5, sixteen_cpus()) == [0, 1, 4, 5, 8]
    assert pick_be_cpus(5, list(reversed(sixteen_cpus()))) == [0, 1, 4, 5, 8]
    assert pick_be_cpus(0, []) == []
    assert pick_be_cpus(3, sixteen_cpus()[:2]) == []


# -- 12: adjustByCPUSet --------------------------------------------------------------------------------------


def _status(cpuset: str) -> dict[str, str]:
    return {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpuset})}


def _node_with(**annotations: object) -> NodeInfo:
    return make_node(8, annotations={k: json.dumps(v) for k, v in annotations.items()})


def _adjust(old: tuple[int, ...], node: NodeInfo | None = None) -> str:
    from koordqos.strategies.usage import reserved_cpus, system_qos_exclusive_cpus

    lsr = make_pod("lsr", "LSR", kube_qos=KubeQoS.GUARANTEED, annotations=_status("0,6"))
    lse = make_pod("lse", "LSE", kube_qos=KubeQoS.GUARANTEED, annotations=_status("7"))
    node = node or make_node(8)
    inp = inputs(
        policy=Policy.CPUSET,
        pods=[lsr, lse],
        processors=eight_cpus_two_nodes(),
        cpuset=old,
        node=node,
        reserved=reserved_cpus(node),
        sysqos=system_qos_exclusive_cpus(node),
    )
    from koordqos.strategies.suppressinputs import scheduler_cpusets

    writes = CPUSuppress().adjust_by_cpuset(inp, 3000, scheduler_cpusets(inp.pods))
    return values(writes, CPUSET_CPUS).get(BE, "unchanged")


def test_case12_adjust_by_cpuset() -> None:
    reservation = "node.koordinator.sh/reservation"
    sysqos = "node.koordinator.sh/system-qos-resource"
    assert _adjust((7, 6, 3, 2)) == "2-4"
    assert _adjust((7, 6)) == "2-4"
    assert _adjust((7, 6, 3, 2), _node_with(**{reservation: {"reservedCPUs": "3"}})) == "0,4-5"
    assert _adjust((7, 6, 3, 2), _node_with(**{reservation: {"reservedCPUs": "1-6"}})) == "unchanged"
    assert _adjust((7, 6, 3, 2), _node_with(**{reservation: {"reservedCPUs": "0-1,5-6"}})) == "2-4"
    assert _adjust((7, 6, 3, 2), _node_with(**{sysqos: {"cpuset": "3"}})) == "0,4-5"
    assert _adjust((7, 6, 3, 2), _node_with(**{sysqos: {"cpuset": "1-6"}})) == "unchanged"
    assert _adjust((7, 6, 3, 2), _node_with(**{sysqos: {"cpuset": "0-1,5-6"}})) == "2-4"
    assert _adjust((7, 6, 3, 2), _node_with(**{sysqos: {"cpuset": "1-6", "cpusetExclusive": False}})) == "2-4"


def test_both_pools_empty_leaves_cpusets_unchanged() -> None:
    lse = make_pod("lse", "LSE", kube_qos=KubeQoS.GUARANTEED, annotations=_status("0-7"))
    inp = inputs(policy=Policy.CPUSET, pods=[lse], processors=eight_cpus_two_nodes(), cpuset=(0, 1))
    from koordqos.strategies.suppressinputs import scheduler_cpusets

    assert CPUSuppress().adjust_by_cpuset(inp, 3000, scheduler_cpusets(inp.pods)) == []


def test_cpuset_growth_is_step_limited() -> None:
    inp = inputs(policy=Policy.CPUSET, pods=[be_pod()], cpuset=(0, 1))
    writes = CPUSuppress().adjust_by_cpuset(inp, 12000, {})
    assert values(writes, CPUSET_CPUS)[BE] == "0-1,4-5"  # 2 + ceil(16 × 10 %) = 4 CPUs


# -- 13–15: recovery and the static kubelet policy -----------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, "0-6,8-15"),
        ({"node.koordinator.sh/reservation": {"reservedCPUs": "0-1"}}, "2-6,8-15"),
        ({"node.koordinator.sh/system-qos-resource": {"cpuset": "0-1"}}, "2-6,8-15"),
    ],
)
@pytest.mark.parametrize("previous", [None, Status.USING, Status.RECOVERED])
def test_case13_recover_cpuset(
    annotations: dict[str, object], expected: str, previous: Status | None
) -> None:
    from koordqos.strategies.suppressinputs import scheduler_cpusets
    from koordqos.strategies.usage import reserved_cpus, system_qos_exclusive_cpus

    node = make_node(16, annotations={k: json.dumps(v) for k, v in annotations.items()})
    lse = make_pod("lse", "LSE", kube_qos=KubeQoS.GUARANTEED, annotations=_status("7"))
    inp = inputs(pods=[lse], node=node, reserved=reserved_cpus(node), sysqos=system_qos_exclusive_cpus(node))
    s = CPUSuppress()
    if previous is not None:
        s.statuses[Policy.CPUSET] = previous
    writes = s.recover_cpuset(inp, scheduler_cpusets(inp.pods), 2)
    assert set(values(writes, CPUSET_CPUS).values()) == {expected}
    assert len(writes) == len(BE_DIRS)
    assert s.statuses[Policy.CPUSET] is Status.RECOVERED


@pytest.mark.parametrize(("previous", "writes"), [(None, 1), (Status.USING, 1), (Status.RECOVERED, 0)])
def test_case14_recover_cfs_quota(previous: Status | None, writes: int) -> None:
    s = CPUSuppress()
    if previous is not None:
        s.statuses[Policy.CFS_QUOTA] = previous
    out = s.recover_cfs_quota(inputs())
    assert [w.value for w in out] == ["-1"] * writes
    assert s.statuses[Policy.CFS_QUOTA] is Status.RECOVERED


def test_case15_static_kubelet_policy() -> None:
    inp = inputs(policy=Policy.CPUSET, pods=[be_pod()], kubelet_policy="static", cpuset=tuple(range(16)))
    writes = CPUSuppress().apply_be_cpuset(inp, [0, 1, 2, 3], {})
    assert values(writes, CPUSET_CPUS) == {BE: "0-15", POD: "0-15", CTR: "0-3", SANDBOX: "0-3"}


def test_kubelet_policy_annotation_is_read() -> None:
    from koordqos.strategies.usage import cpu_manager_policy

    node = make_node(annotations={"kubelet.koordinator.sh/cpu-manager-policy": '{"policy":"static"}'})
    assert cpu_manager_policy(node) == "static"
    assert cpu_manager_policy(make_node(annotations={"kubelet.koordinator.sh/cpu-manager-policy": "x"})) == ""
    assert cpu_manager_policy(None) == ""


async def test_recovery_is_remembered_only_once_its_write_landed(tmp_path: Path) -> None:
    """A failed "-1" recovery write is retried next round instead of leaving BE capped until a restart."""
    from koordqos.cgroups.executor import CgroupExecutor, Outcome, WriteResult
    from koordqos.config import build_config
    from koordqos.decisions import DecisionLog
    from koordqos.events.types import NodeSLOUpdated, NodeUpdated
    from koordqos.metrics.store import MetricStore
    from koordqos.metrics.topology import read_topology
    from koordqos.model.node import NodeInfo
    from koordqos.model.nodeslo import parse_nodeslo
    from koordqos.model.qos import KubeQoS
    from koordqos.state import NodeState, reduce
    from koordqos.strategies.cpusuppress import CPUSuppressStrategy
    from koordqos.testing.nodefs import SyntheticNode
    from koordqos.testing.strategyenv import strategy_env

    node = SyntheticNode(tmp_path, cpus=8)
    be_dir = node.layout.qos_dir(KubeQoS.BESTEFFORT)
    node.write(be_dir, "cpu", "cpu.cfs_quota_us", 200000)  # left suppressed by an earlier run
    state = reduce(
        NodeState(), NodeUpdated(NodeInfo(name="n", capacity={"cpu": 8000}, allocatable={"cpu": 8000}))
    )
    slo = parse_nodeslo(
        {"spec": {"resourceUsedThresholdWithBE": {"enable": False, "cpuSuppressPolicy": "cfsQuota"}}}
    )
    state = reduce(state, NodeSLOUpdated(slo))
    decisions = DecisionLog()
    calls: list[list[str]] = []

    class FailingOnce(CgroupExecutor):
        """The real executor, except that the first quota write fails (a transient EBUSY, say)."""

        failed = False

        async def apply_sequential(self, strategy: str, writes: Any, reason: str = "") -> list[WriteResult]:
            calls.append([f"{w.resource}={w.value}" for w in writes])
            out = []
            for w in writes:
                if w.resource == "cpu.cfs_quota_us" and not self.failed:
                    self.failed = True
                    out.append(WriteResult(w, Outcome.FAILED, error="Device or resource busy"))
                else:
                    out.append(await self.update(strategy, w, reason))
            return out

    env = strategy_env(
        node.layout,
        decisions,
        config=build_config({}),
        executor=FailingOnce(node.layout, decisions, force_update_seconds=0),
        store=MetricStore(600, 1.0),
        topology=read_topology(node.sys_root),
    )
    strategy = CPUSuppressStrategy()
    quota_writes = lambda: [c for c in calls if any(x.startswith("cpu.cfs_quota_us=") for x in c)]  # noqa: E731
    await strategy.run_once(state, env)
    assert node.read(be_dir, "cpu", "cpu.cfs_quota_us") == "200000"  # the write failed
    await strategy.run_once(state, env)
    assert node.read(be_dir, "cpu", "cpu.cfs_quota_us") == "-1"  # retried and landed
    assert len(quota_writes()) == 2
    await strategy.run_once(state, env)
    assert len(quota_writes()) == 2  # recovered now: not written again
