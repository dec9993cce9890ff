"""CPUSetAllocator: koordlet's cases S1–S21 (docs/behaviour-runtime-hooks.md, "CPUSetAllocator"). File
effects are in test_reconciler.py."""

from __future__ import annotations

import json

import pytest

from koordqos.hooks.context import ContainerContext, ContainerRequest, PodContext, PodRequest
from koordqos.hooks.cpuset import CPUSetAllocator
from koordqos.hooks.rules import CPUSharePool, RuleError, TopologyView, topology_view
from koordqos.model.qos import QoSClass

RS = "scheduling.koordinator.sh/resource-status"
POOLS = (CPUSharePool(0, 0, "0-7"), CPUSharePool(1, 1, "8-15"))


def ctx(
    labels: dict[str, str] | None = None,
    status: object = None,
    parent: str = "kubepods/pod1/c1",
    raw_status: str | None = None,
) -> ContainerContext:
    ann = {}
    if status is not None:
        ann[RS] = json.dumps(status)
    if raw_status is not None:
        ann[RS] = raw_status
    return ContainerContext(
        ContainerRequest(
            pod_uid="u",
            container_name="c",
            pod_labels=labels or {},
            pod_annotations=ann,
            cgroup_parent=parent,
        )
    )


def hook(
    rule: TopologyView | None = None, be_cpu_manager: bool = False, disable_unset: bool = False
) -> CPUSetAllocator:
    h = CPUSetAllocator(disable_unset, be_cpu_manager)
    h.rule = rule
    return h


def cpuset_of(h: CPUSetAllocator, c: ContainerContext) -> str | None:
    h.set_container_cpuset(c)
    return c.response.resources.cpuset


def q(v: str) -> dict[str, str]:
    return {"koordinator.sh/qosClass": v}


def test_s1_scheduler_cpuset_without_rule() -> None:
    assert cpuset_of(hook(), ctx(status={"cpuset": "2-4"})) == "2-4"


def test_s2_bad_resource_status_is_an_error() -> None:
    for fn in (hook().set_container_cpuset, hook().set_cpuset_and_unset_cfs):
        with pytest.raises(ValueError, match="resource-status"):
            fn(ctx(raw_status="bad-format"))


def test_s3_numa_without_resources_and_no_rule() -> None:
    assert cpuset_of(hook(), ctx(status={"numaNodeResources": [{"node": 0}]})) is None


SYS_RULE = TopologyView(share_pools=POOLS, system_qos_cpuset="0-3")
BE_RULE = TopologyView(
    share_pools=(CPUSharePool(0, 0, "1-7"), CPUSharePool(1, 1, "9-15")), be_share_pools=POOLS
)


@pytest.mark.parametrize(
    ("rule", "labels", "status", "parent", "be_mgr", "want"),
    [
        (SYS_RULE, q("SYSTEM"), None, "kubepods/pod1/c1", False, "0-3"),  # S4
        (TopologyView(share_pools=POOLS), q("SYSTEM"), None, "kubepods/pod1/c1", False, "0-7,8-15"),  # S5
        (
            SYS_RULE,
            {},
            {"numaNodeResources": [{"node": 0, "resources": {"cpu": "2"}}]},
            "kubepods/pod1/c1",
            False,
            "0-7",
        ),  # S6
        (SYS_RULE, {}, None, "kubepods/besteffort/pod1/c1", False, ""),  # S7
        (
            BE_RULE,
            q("BE"),
            {"numaNodeResources": [{"node": 0, "resources": {"cpu": "2"}}]},
            "kubepods/besteffort/pod1/c1",
            True,
            "0-7",
        ),  # S8
        (
            BE_RULE,
            q("LS"),
            {"numaNodeResources": [{"node": 1, "resources": {"cpu": "2"}}]},
            "kubepods/burstable/pod1/c1",
            False,
            "9-15",
        ),  # S9
        (
            BE_RULE,
            q("BE"),
            {"numaNodeResources": [{"node": 1, "resources": {"kubernetes.io/batch-cpu": "2000"}}]},
            "kubepods/besteffort/pod1/c1",
            True,
            "8-15",
        ),  # S10
        (
            TopologyView(share_pools=POOLS),
            q("LS"),
            None,
            "kubepods/burstable/pod1/c1",
            False,
            "0-7,8-15",
        ),  # S11
        (
            TopologyView(share_pools=POOLS),
            q("LS"),
            {"numaNodeResources": [{"node": 0}]},
            "kubepods/burstable/pod1/c1",
            False,
            "0-7,8-15",
        ),  # S12
        (
            TopologyView(share_pools=POOLS, kubelet_policy="none"),
            {},
            None,
            "kubepods/burstable/pod1/c1",
            False,
            "0-7,8-15",
        ),  # S13
        (
            TopologyView(share_pools=POOLS, kubelet_policy="static"),
            {},
            None,
            "kubepods/burstable/pod1/c1",
            False,
            None,
        ),  # S14
        (
            SYS_RULE,
            q("SYSTEM"),
            {"numaNodeResources": [{"node": 1, "resources": {"hugepages-1Gi": "2Gi"}}]},
            "kubepods/pod1/c1",
            False,
            "0-3",
        ),  # S15
    ],
    ids=["S4", "S5", "S6", "S7", "S8", "S9", "S10", "S11", "S12", "S13", "S14", "S15"],
)
def test_share_pool_cpuset(
    rule: TopologyView, labels: dict[str, str], status: object, parent: str, be_mgr: bool, want: str | None
) -> None:
    assert cpuset_of(hook(rule, be_mgr), ctx(labels, status, parent)) == want


def pod_ctx(status: object = None, labels: dict[str, str] | None = None) -> PodContext:
    ann = {RS: json.dumps(status)} if status is not None else {}
    return PodContext(
        PodRequest(uid="u", labels=labels or {}, annotations=ann, cgroup_parent="kubepods/besteffort/pod1")
    )


def test_s16_unset_pod_quota_for_pinned_pod() -> None:
    c = pod_ctx({"cpuset": "2-4"})
    hook().unset_pod_cpu_quota(c)
    assert c.response.resources.cfs_quota == -1


@pytest.mark.parametrize("qos", ["LSR", "LSE"])
def test_s17_disable_unset_cpu_quota(qos: str) -> None:
    c = pod_ctx({"cpuset": "2-4"}, q(qos))
    hook(disable_unset=True).unset_pod_cpu_quota(c)
    assert c.response.resources.cfs_quota is None


@pytest.mark.parametrize("status", [{"numaNodeResources": [{"node": 0}]}, None])
def test_s18_no_cpuset_no_unset(status: object) -> None:
    c = pod_ctx(status)
    hook().unset_pod_cpu_quota(c)
    assert c.response.resources.cfs_quota is None


def test_s19_container_cpuset_and_unset_quota() -> None:
    c = ctx(q("LSR"), {"cpuset": "0-3"})
    hook().set_cpuset_and_unset_cfs(c)
    assert (c.response.resources.cpuset, c.response.resources.cfs_quota) == ("0-3", -1)


def test_s20_host_app() -> None:
    assert hook(TopologyView(share_pools=POOLS)).host_app_cpuset(QoSClass.LS) == "0-7,8-15"
    with pytest.raises(ValueError, match="only LS"):
        hook(TopologyView(share_pools=POOLS)).host_app_cpuset(QoSClass.LSR)
    assert hook(None).host_app_cpuset(QoSClass.LS) is None


def test_s21_bad_share_pools_keep_the_old_rule() -> None:
    h = hook()
    good = {"node.koordinator.sh/cpu-shared-pools": '[{"socket":0,"node":0,"cpuset":"0-7"}]'}
    assert h.update_rule(topology_view(good)) is True
    with pytest.raises(RuleError):
        topology_view({"node.koordinator.sh/cpu-shared-pools": "bad-fmt"})
    assert h.rule is not None
    assert h.rule.share_pools == (CPUSharePool(0, 0, "0-7"),)
    assert h.update_rule(topology_view(good)) is False
