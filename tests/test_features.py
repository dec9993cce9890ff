"""koordlet's feature gates (#32 6): every name accepted, the inert ones listed, "did you mean" for a typo."""

from __future__ import annotations

import pytest

from koordqos.errors import ConfigError
from koordqos.features import DEFAULT_GATES, NOT_ACTED_ON, NOT_IMPLEMENTED, inert_gates, parse_feature_gates

# koordlet's gates (docs/behaviour-qos-manager.md, "Feature gates and the NodeSLO switch"; the list in
# docs/configuration.md), the ones koordqos does not implement included
KOORDLET_GATES = [
    "BECPUSuppress",
    "BECPUManager",
    "BECPUEvict",
    "CPUEvict",
    "CPUAllocatableEvict",
    "BEMemoryEvict",
    "MemoryEvict",
    "MemoryAllocatableEvict",
    "CPUBurst",
    "SystemConfig",
    "RdtResctrl",
    "CgroupReconcile",
    "BlkIOReconcile",
    "GroupIdentity",
    "CPUSetAllocator",
    "BatchResource",
    "GPUEnvInject",
    "RDMADeviceInject",
    "CPUNormalization",
    "CoreSched",
    "TerwayQoS",
    "TCNetworkQoS",
    "Resctrl",
    "OOMScoreAdj",
    "PerCPUMetric",
    "HamiCoreVGPUMonitor",
    "NodeTopologyReport",
    "PodResourcesProxy",
    "Accelerators",
    "PSICollector",
    "HugePageReport",
    "AuditEvents",
    "AuditEventsHTTPHandler",
    "CPICollector",
    "Libpfm4",
    "ColdPageCollector",
    "ResctrlCollector",
    "RDMADevices",
    "NodeMetricPromMetrics",
]


def test_every_koordlet_gate_name_is_accepted() -> None:
    text = ",".join(f"{g}=true" for g in KOORDLET_GATES)
    gates = parse_feature_gates(text)
    assert all(gates[g] for g in KOORDLET_GATES)
    assert set(KOORDLET_GATES) <= set(DEFAULT_GATES)


def test_the_inert_gates_are_the_issues_lists_and_off_by_default() -> None:
    assert set(NOT_IMPLEMENTED) == {
        "AuditEvents",
        "CPICollector",
        "Libpfm4",
        "ColdPageCollector",
        "ResctrlCollector",
        "RDMADevices",
        "PodResourcesProxy",
        "HamiCoreVGPUMonitor",
        "NodeMetricPromMetrics",
        "AuditEventsHTTPHandler",
    }
    assert set(NOT_ACTED_ON) == {
        "TerwayQoS",
        "TCNetworkQoS",
        "GPUEnvInject",
        "RDMADeviceInject",
        "Accelerators",
        "PerCPUMetric",
    }
    assert "PSICollector" not in NOT_IMPLEMENTED  # metrics/psi.py
    assert inert_gates(parse_feature_gates(None)) == ([], [])


def test_the_inert_gates_on_are_listed_in_order() -> None:
    # the koordlet chart's default gates and AllAlpha (Kustomize's koordlet.yaml)
    chart = parse_feature_gates("BECPUEvict=true,BEMemoryEvict=true,CgroupReconcile=true,Accelerators=true")
    assert inert_gates(chart) == ([], ["Accelerators"])
    assert inert_gates(parse_feature_gates("AllAlpha=true,AllBeta=true")) == (
        list(NOT_IMPLEMENTED),
        list(NOT_ACTED_ON),
    )


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("CPUSuppress", "BECPUSuppress"),  # koordlet's strategy name, not its gate
        ("becpusuppress", "BECPUSuppress"),
        ("BlkioReconcile", "BlkIOReconcile"),
        ("PSICollecter", "PSICollector"),
        ("Allalpha", "AllAlpha"),
    ],
)
def test_an_unknown_gate_gets_did_you_mean(typo: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=rf"^unknown feature gate '{typo}' \(did you mean '{meant}'\?\)$"):
        parse_feature_gates(f"{typo}=true")


def test_an_unknown_gate_far_from_any_lists_the_known_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"^unknown feature gate 'Zzzzzz' \(known: Accelerators, AllAlpha, "
    ):
        parse_feature_gates("Zzzzzz=true")
