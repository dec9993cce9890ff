"""NodeSLO: koordlet defaults, JSON-overlay merge, None templates for disabled classes, errors, switch;
NodeInfo parsing and node annotations; cpusets and quantities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.cli import validate_file
from koordqos.errors import ConfigError, ModelError
from koordqos.model.cpuset import format_cpuset, parse_cpuset
from koordqos.model.memoryqos import default_memory_qos
from koordqos.model.node import parse_node
from koordqos.model.nodeslo import (
    CPUBurstConfig,
    NodeSLO,
    ResourceThresholdStrategy,
    default_nodeslo,
    is_feature_disabled,
    merge_pod_cpu_burst,
    parse_nodeslo,
)
from koordqos.model.quantity import parse_resource_list, resource_value


def test_defaults_match_koordlet() -> None:
    slo = default_nodeslo()
    t = slo.resource_used_threshold_with_be
    assert t is not None
    assert (
        t.enable,
        t.cpu_suppress_threshold_percent,
        t.cpu_suppress_policy,
        t.memory_evict_threshold_percent,
        t.cpu_evict_policy,
    ) == (False, 65, "cpuset", 70, "evictByRealLimit")
    assert t.memory_evict_lower_percent is None
    assert t.cpu_suppress_min_percent is None
    burst = slo.cpu_burst_strategy
    assert burst is not None
    assert (
        burst.policy,
        burst.cpu_burst_percent,
        burst.cfs_quota_burst_percent,
        burst.cfs_quota_burst_period_seconds,
        burst.share_pool_threshold_percent,
    ) == ("none", 1000, 300, -1, 50)
    assert slo.system_strategy is not None
    assert slo.system_strategy.total_network_bandwidth == "0"
    assert slo.system_strategy.min_free_kbytes_factor is None
    q = slo.resource_qos_strategy
    assert q is not None
    assert q.policies is not None
    assert (q.policies.cpu_policy, q.policies.net_qos_policy) == ("groupIdentity", "tc")
    # every class is disabled by default, so it carries the None templates
    for cls in (q.lsr_class, q.ls_class, q.be_class):
        assert cls is not None
        assert cls.cpu_qos is not None
        assert cls.memory_qos is not None
        assert cls.cpu_qos.enable is False
        assert (cls.cpu_qos.group_identity, cls.cpu_qos.sched_idle, cls.cpu_qos.core_expeller) == (
            0,
            0,
            False,
        )
        assert (
            cls.memory_qos.wmark_ratio,
            cls.memory_qos.wmark_scale_permill,
            cls.memory_qos.wmark_min_adj,
        ) == (0, 50, 0)
        assert cls.resctrl_qos is not None
        rq = cls.resctrl_qos
        assert (rq.cat_range_start_percent, rq.cat_range_end_percent, rq.mba_percent) == (0, 100, 100)
    assert slo.host_applications == ()


def test_enabled_classes_keep_koordlet_default_values() -> None:
    spec = {
        "resourceQOSStrategy": {
            "lsrClass": {"cpuQOS": {"enable": True}, "memoryQOS": {"enable": True}},
            "lsClass": {"cpuQOS": {"enable": True}},
            "beClass": {
                "cpuQOS": {"enable": True},
                "memoryQOS": {"enable": True},
                "resctrlQOS": {"enable": True},
            },
        }
    }
    q = parse_nodeslo({"spec": spec}).resource_qos_strategy
    assert q is not None
    assert q.lsr_class
    assert q.ls_class
    assert q.be_class
    assert q.lsr_class.cpu_qos
    assert (
        q.lsr_class.cpu_qos.group_identity,
        q.lsr_class.cpu_qos.core_expeller,
    ) == (2, True)
    assert q.ls_class.cpu_qos
    assert q.ls_class.cpu_qos.group_identity == 2
    assert q.be_class.cpu_qos
    assert q.be_class.cpu_qos.group_identity == -1
    assert q.lsr_class.memory_qos
    assert q.lsr_class.memory_qos.wmark_min_adj == -25
    assert q.be_class.memory_qos
    assert q.be_class.memory_qos.wmark_min_adj == 50
    assert q.be_class.memory_qos.wmark_ratio == 95
    assert q.be_class.memory_qos.wmark_scale_permill == 20
    assert q.be_class.resctrl_qos
    assert q.be_class.resctrl_qos.cat_range_end_percent == 30
    # LS memory stays disabled → None template
    assert q.ls_class.memory_qos
    assert q.ls_class.memory_qos.wmark_ratio == 0
    assert q.for_class("LSE") is q.lsr_class
    assert q.for_class("") is None


def test_overlay_merges_objects_and_keeps_unset_defaults() -> None:
    slo = parse_nodeslo(
        {
            "apiVersion": "slo.koordinator.sh/v1alpha1",
            "kind": "NodeSLO",
            "metadata": {"name": "n1", "resourceVersion": "42"},
            "spec": {
                "resourceUsedThresholdWithBE": {
                    "enable": True,
                    "cpuSuppressPolicy": "cfsQuota",
                    "memoryEvictThresholdPercent": None,
                },
                "cpuBurstStrategy": {"policy": "auto"},
                "systemStrategy": {"minFreeKbytesFactor": 88, "schedFeatures": {"X": True}},
                "hostApplications": [
                    {"name": "nginx", "qos": "LS", "cgroupPath": {"base": "CgroupRoot", "relativePath": "n/"}}
                ],
                "extensions": {"foo": {"bar": 1}},
            },
        }
    )
    t = slo.resource_used_threshold_with_be
    assert t is not None
    assert (
        t.enable,
        t.cpu_suppress_policy,
        t.cpu_suppress_threshold_percent,
        t.memory_evict_threshold_percent,
    ) == (True, "cfsQuota", 65, 70)  # null leaves the default
    assert slo.cpu_burst_strategy
    assert slo.cpu_burst_strategy.policy == "auto"
    assert slo.cpu_burst_strategy.cpu_burst_percent == 1000
    assert slo.system_strategy
    assert slo.system_strategy.min_free_kbytes_factor == 88
    assert slo.system_strategy.total_network_bandwidth == "0"
    assert slo.system_strategy.sched_features == {"X": True}
    assert slo.host_applications[0].name == "nginx"
    assert slo.host_applications[0].cgroup_path is not None
    assert slo.host_applications[0].cgroup_path.relative_path == "n/"
    assert slo.extensions == {"foo": {"bar": 1}}
    assert (slo.name, slo.resource_version) == ("n1", "42")


def test_a_bare_spec_is_accepted_and_unknown_fields_ignored() -> None:
    slo = parse_nodeslo(
        {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 40}, "futureField": 1}
    )
    assert slo.resource_used_threshold_with_be is not None
    assert slo.resource_used_threshold_with_be.cpu_suppress_threshold_percent == 40


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": "65"}},
            "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent",
        ),
        ({"resourceUsedThresholdWithBE": {"enable": "yes"}}, "resourceUsedThresholdWithBE.enable"),
        (
            {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "quota"}},
            "resourceUsedThresholdWithBE.cpuSuppressPolicy",
        ),
        (
            {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 1.5}}}},
            "resourceQOSStrategy.beClass.cpuQOS.groupIdentity",
        ),
        ({"cpuBurstStrategy": {"policy": "always"}}, "cpuBurstStrategy.policy"),
        ({"cpuBurstStrategy": []}, "cpuBurstStrategy"),
        ({"hostApplications": [{"qos": "LS"}]}, "hostApplications.0.name"),
        (
            {"resourceQOSStrategy": {"policies": {"cpuPolicy": "turbo"}}},
            "resourceQOSStrategy.policies.cpuPolicy",
        ),
    ],
)
def test_invalid_fields_raise_a_model_error_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelError) as err:
        parse_nodeslo({"spec": spec})
    assert str(err.value).startswith(field + ":") or field in str(err.value)


def test_non_mapping_documents_are_rejected() -> None:
    with pytest.raises(ModelError, match="spec: expected an object"):
        parse_nodeslo({"spec": "nope"})
    with pytest.raises(ModelError):
        parse_nodeslo(["a"])  # type: ignore[arg-type]


def test_feature_switch_distinguishes_nil_and_false() -> None:
    assert is_feature_disabled(None, "CPUEvict") == (True, "nodeSLO is nil")
    empty = NodeSLO()
    disabled, err = is_feature_disabled(empty, "CPUEvict")
    assert disabled
    assert err is not None
    nil_enable = NodeSLO(resource_used_threshold_with_be=ResourceThresholdStrategy())
    assert is_feature_disabled(nil_enable, "BECPUSuppress")[1] is not None
    assert is_feature_disabled(default_nodeslo(), "BECPUSuppress") == (True, None)  # default enable=false
    on = parse_nodeslo({"spec": {"resourceUsedThresholdWithBE": {"enable": True}}})
    for feature in (
        "BECPUSuppress",
        "BEMemoryEvict",
        "BECPUEvict",
        "CPUEvict",
        "MemoryEvict",
        "CPUAllocatableEvict",
        "MemoryAllocatableEvict",
    ):
        assert is_feature_disabled(on, feature) == (False, None)
    assert is_feature_disabled(on, "CPUBurst") == (True, "unsupported feature CPUBurst")


def test_pod_cpu_burst_merge_and_recommended_memory_qos() -> None:
    node = CPUBurstConfig.model_validate(
        {
            "policy": "auto",
            "cpuBurstPercent": 1000,
            "cfsQuotaBurstPercent": 300,
            "cfsQuotaBurstPeriodSeconds": 600,
        }
    )
    pod = CPUBurstConfig.model_validate({"policy": "cpuBurstOnly", "cpuBurstPercent": 500})
    merged = merge_pod_cpu_burst(node, pod)
    assert merged is not None
    assert (
        merged.policy,
        merged.cpu_burst_percent,
        merged.cfs_quota_burst_percent,
        merged.cfs_quota_burst_period_seconds,
    ) == ("cpuBurstOnly", 500, 300, 600)
    be = default_memory_qos("BE")
    assert be is not None
    assert (be.wmark_ratio, be.wmark_scale_permill, be.wmark_min_adj) == (95, 20, 50)
    system = default_memory_qos("SYSTEM")
    assert system is not None
    assert (system.wmark_ratio, system.wmark_scale_permill) == (0, 50)
    assert default_memory_qos("") is None


def test_cli_validate_reports_the_bad_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "kind: NodeSLO\nspec:\n  resourceUsedThresholdWithBE:\n    cpuSuppressThresholdPercent: 60\n"
    )
    assert validate_file(good) == 0
    assert "valid NodeSLO" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: NodeSLO\nspec:\n  cpuBurstStrategy:\n    cpuBurstPercent: lots\n")
    with pytest.raises(ConfigError, match=r"cpuBurstStrategy\.cpuBurstPercent"):
        validate_file(bad)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "enable",
                        "cpuQOS",
                        "lsClass",
                        "groupIdentity",
                        "policy",
                        "resourceQOSStrategy",
                        "resourceUsedThresholdWithBE",
                        "cpuSuppressThresholdPercent",
                        "x",
                    ]
                ),
                c,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_arbitrary_specs_parse_or_raise_model_error(spec: Any) -> None:
    doc = {"spec": spec} if isinstance(spec, dict) else {"spec": {"cpuBurstStrategy": spec}}
    outcome: NodeSLO | str
    try:
        outcome = parse_nodeslo(doc)
    except ModelError as exc:
        outcome = str(exc)
    assert isinstance(outcome, NodeSLO) or ":" in outcome


# -- nodes, cpusets, quantities ------------------------------------------------------------------------


def node_raw(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "uid": "nu", "resourceVersion": "7", "annotations": annotations or {}},
        "status": {
            "capacity": {"cpu": "8", "memory": "16Gi", "kubernetes.io/batch-cpu": "4000"},
            "allocatable": {"cpu": "7500m", "memory": "15Gi", "kubernetes.io/batch-cpu": "3000"},
        },
    }


def test_node_capacity_and_reserved() -> None:
    node = parse_node(
        node_raw({"node.koordinator.sh/reservation": '{"resources":{"memory":"2Gi"},"reservedCPUs":"0-1"}'})
    )
    assert node.capacity == {"cpu": 8000, "memory": 16 * 1024**3, "kubernetes.io/batch-cpu": 4000}
    assert node.allocatable["cpu"] == 7500
    assert node.kubelet_reserved() == {"cpu": 500, "memory": 1024**3}
    assert node.reserved() == {"cpu": 2000, "memory": 2 * 1024**3}
    assert node.reservation is not None
    assert node.reservation.reserved_cpus == (0, 1)


@pytest.mark.parametrize(
    ("value", "ratio", "bad"),
    [(None, None, False), ("1.10", 1.1, False), ("[}", None, True), ("0", None, True), ("-1.2", None, True)],
)
def test_cpu_normalization_ratio(value: str | None, ratio: float | None, bad: bool) -> None:
    ann = {} if value is None else {"node.koordinator.sh/cpu-normalization-ratio": value}
    node = parse_node(node_raw(ann))
    assert node.cpu_normalization_ratio == ratio
    assert ("node.koordinator.sh/cpu-normalization-ratio" in node.problems) is bad


def test_system_qos_resource() -> None:
    node = parse_node(
        node_raw({"node.koordinator.sh/system-qos-resource": '{"cpuset":"1-6","cpusetExclusive":false}'})
    )
    assert node.system_qos_resource is not None
    assert node.system_qos_resource.cpuset == (1, 2, 3, 4, 5, 6)
    assert not node.system_qos_resource.cpuset_exclusive
    default_excl = parse_node(node_raw({"node.koordinator.sh/system-qos-resource": '{"cpuset":"0-3"}'}))
    assert default_excl.system_qos_resource is not None
    assert default_excl.system_qos_resource.cpuset_exclusive
    bad = parse_node(node_raw({"node.koordinator.sh/system-qos-resource": '{"cpuset":"x"}'}))
    assert bad.system_qos_resource is None
    assert bad.problems


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("", ()), ("0-3,8", (0, 1, 2, 3, 8)), ("7,6,3,2", (2, 3, 6, 7)), (" 1 , 3-4 ", (1, 3, 4))],
)
def test_cpuset_round_trip(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpuset(text) == cpus
    assert parse_cpuset(format_cpuset(cpus)) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "1-", "0-99999999"])
def test_bad_cpusets(text: str) -> None:
    with pytest.raises(ModelError):
        parse_cpuset(text)


def test_format_cpuset_collapses_ranges() -> None:
    assert format_cpuset([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7"


def test_quantities() -> None:
    assert resource_value("cpu", "1.5") == 1500
    assert resource_value("memory", "1Ki") == 1024
    assert resource_value("kubernetes.io/batch-cpu", "2000") == 2000
    values, errors = parse_resource_list({"cpu": "1", "memory": "x", "pods": True})
    assert values == {"cpu": 1000}
    assert len(errors) == 2
