"""Hook framework: name order (last writer wins), failure policy, registry rules, gates and defaults."""

from __future__ import annotations

import pytest

from koordqos.config import HOOK_STAGES, parse_failure_policy
from koordqos.errors import ConfigError, HookError
from koordqos.hooks.context import STAGES, PodContext, PodRequest, Stage
from koordqos.hooks.core import Call, run_stage
from koordqos.hooks.framework import HookRegistry
from koordqos.hooks.runtime import HookOptions, RuntimeHooks, pod_qos_condition


def ctx() -> PodContext:
    return PodContext(PodRequest(uid="u"))


def setter(value: int) -> object:
    def fn(c: PodContext) -> None:
        c.response.resources.cfs_quota = value

    return fn


def test_hooks_run_in_name_order_and_the_last_writer_wins() -> None:
    reg = HookRegistry()
    reg.register(Stage.PRE_RUN_POD_SANDBOX, "b", "", setter(2))  # type: ignore[arg-type]
    reg.register(Stage.PRE_RUN_POD_SANDBOX, "a", "", setter(1))  # type: ignore[arg-type]
    reg.register(Stage.PRE_RUN_POD_SANDBOX, "B", "", setter(3))  # type: ignore[arg-type]
    c = ctx()
    result = Call.start("test", 10.0, "Ignore")
    run_stage(reg, result, Stage.PRE_RUN_POD_SANDBOX, c)
    assert result.ran == ["B", "a", "b"]  # upper case first, as Go string order
    assert c.response.resources.cfs_quota == 2


def boom(c: PodContext) -> None:
    raise ValueError("bad annotation")


def test_ignore_policy_continues_and_fail_policy_stops() -> None:
    reg = HookRegistry()
    reg.register(Stage.PRE_RUN_POD_SANDBOX, "a", "", boom)
    reg.register(Stage.PRE_RUN_POD_SANDBOX, "b", "", setter(5))  # type: ignore[arg-type]
    c = ctx()
    result = Call.start("test", 10.0, "Ignore")
    run_stage(reg, result, Stage.PRE_RUN_POD_SANDBOX, c)
    assert result.errors == {"a": "ValueError: bad annotation"}
    assert c.response.resources.cfs_quota == 5
    c2 = ctx()
    with pytest.raises(HookError, match="hook a failed"):
        run_stage(reg, Call.start("test", 10.0, "Fail"), Stage.PRE_RUN_POD_SANDBOX, c2)
    assert c2.response.resources.cfs_quota is None


def test_duplicate_name_in_a_stage_is_refused_and_stages_are_ordered() -> None:
    reg = HookRegistry()
    reg.register(Stage.PRE_UPDATE_CONTAINER_RESOURCES, "x", "", boom)
    reg.register(Stage.PRE_RUN_POD_SANDBOX, "x", "", boom)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Stage.PRE_RUN_POD_SANDBOX, "x", "", boom)
    assert reg.stages() == [Stage.PRE_RUN_POD_SANDBOX, Stage.PRE_UPDATE_CONTAINER_RESOURCES]
    assert reg.stages(frozenset({Stage.PRE_RUN_POD_SANDBOX})) == [Stage.PRE_UPDATE_CONTAINER_RESOURCES]
    assert STAGES[0] is Stage.PRE_RUN_POD_SANDBOX
    assert tuple(s.value for s in STAGES) == HOOK_STAGES  # the names config validates against


def test_failure_policy_strings() -> None:
    assert parse_failure_policy("Fail") == "Fail"
    assert parse_failure_policy("Ignore") == "Ignore"
    with pytest.raises(ConfigError):
        parse_failure_policy("fail")


def test_default_gates_and_stage_table() -> None:
    hooks = RuntimeHooks()
    assert hooks.names == ["BatchResource", "CPUSetAllocator", "GroupIdentity"]
    names = {s: [h.name for h in hooks.registry.hooks(s)] for s in hooks.registry.stages()}
    assert names == {
        Stage.PRE_RUN_POD_SANDBOX: ["BatchResource", "CPUSetAllocator", "GroupIdentity"],
        Stage.PRE_CREATE_CONTAINER: ["BatchResource", "CPUSetAllocator"],
        Stage.PRE_UPDATE_CONTAINER_RESOURCES: ["BatchResource", "CPUSetAllocator"],
    }
    everything = RuntimeHooks(
        HookOptions(
            gates={"CPUNormalization": True, "OOMScoreAdj": True, "CoreSched": True, "GroupIdentity": False}
        )
    )
    assert everything.names == [
        "BatchResource",
        "CPUNormalization",
        "CPUSetAllocator",
        "CoreSched",
        "OOMScoreAdj",
    ]
    assert [h.name for h in everything.registry.hooks(Stage.PRE_CREATE_CONTAINER)] == [
        "BatchResource",
        "CPUNormalization",
        "CPUSetAllocator",
        "OOMScoreAdj",
    ]


def test_ls_pod_pinned_by_cpuset_gets_quota_minus_one_over_normalization() -> None:
    from koordqos.hooks.context import ContainerContext, ContainerRequest
    from koordqos.hooks.resources import Resources

    hooks = RuntimeHooks(HookOptions(gates={"CPUNormalization": True}))
    assert hooks.cpu_normalization is not None
    hooks.cpu_normalization.update_rule(1.2)
    c = ContainerContext(
        ContainerRequest(
            pod_uid="u",
            pod_labels={"koordinator.sh/qosClass": "LS"},
            resources=Resources(cfs_quota=100000),
            pod_annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"2-3"}'},
        )
    )
    run_stage(hooks.registry, Call.start("test", 10.0, "Ignore"), Stage.PRE_CREATE_CONTAINER, c)
    assert (c.response.resources.cfs_quota, c.response.resources.cpuset) == (-1, "2-3")


def test_pod_qos_filter_maps_unlabelled_pinned_pods_to_lsr() -> None:
    rs = {"scheduling.koordinator.sh/resource-status": '{"cpuset":"1"}'}
    assert pod_qos_condition({}, rs) == "LSR"
    assert pod_qos_condition({"koordinator.sh/qosClass": "BE"}, rs) == "BE"
    assert pod_qos_condition({"koordinator.sh/qosClass": "weird"}, {}) == ""
