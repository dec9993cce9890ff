"""GroupIdentity: koordlet's cases G1–G10 and P1–P8 (docs/behaviour-runtime-hooks.md, "GroupIdentity");
C1–C4 are in test_reconciler.py."""

from __future__ import annotations

import pytest

from koordqos.hooks.context import KubeQoSContext, PodContext, PodRequest
from koordqos.hooks.groupidentity import BvtRule, BvtSystem, GroupIdentity, parse_bvt_rule
from koordqos.hooks.rules import ClassCPUQOS, SLOView, slo_view
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.qos import KubeQoS, QoSClass

SUPPORTED = BvtSystem(bvt_file=True)
ENABLED_ALL = SLOView(lsr=ClassCPUQOS(True, 2), ls=ClassCPUQOS(True, 2), be=ClassCPUQOS(True, -1))
DEFAULT_RULE = parse_bvt_rule(ENABLED_ALL)


def gi(system: BvtSystem = SUPPORTED, rule: BvtRule | None = DEFAULT_RULE) -> GroupIdentity:
    h = GroupIdentity(system)
    h.rule = rule
    return h


def pod(labels: dict[str, str], parent: str, annotations: dict[str, str] | None = None) -> PodContext:
    return PodContext(
        PodRequest(uid="u", labels=labels, annotations=annotations or {}, cgroup_parent=parent),
        source="proxy",
    )


LS = {"koordinator.sh/qosClass": "LS"}
GUARANTEED_PARENT = "kubepods/pod-guaranteed-test-uid/"


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        (None, 2),  # G1
        ({"koordinator.sh/cpuQOS": '{"enable":true,"groupIdentity":-1}'}, -1),  # G2
        ({"koordinator.sh/cpuQOS": '{"enable":false}'}, 0),  # G3
    ],
    ids=["G1", "G2", "G3"],
)
def test_ls_pod_bvt_and_annotation_override(annotations: dict[str, str] | None, want: int) -> None:
    ctx = pod(LS, GUARANTEED_PARENT, annotations)
    gi().set_pod_bvt_value(ctx)
    assert ctx.response.resources.cpu_bvt == want


def test_cpu_qos_annotation_applies_only_to_ls() -> None:
    ctx = pod(
        {"koordinator.sh/qosClass": "LSR"}, GUARANTEED_PARENT, {"koordinator.sh/cpuQOS": '{"enable":false}'}
    )
    gi().set_pod_bvt_value(ctx)
    assert ctx.response.resources.cpu_bvt == 2


def test_bad_cpu_qos_annotation_is_an_error() -> None:
    for raw in ("{bad", '{"enable":true,"groupIdentity":5}'):
        with pytest.raises(ValueError, match="cpuQOS"):
            gi().set_pod_bvt_value(pod(LS, GUARANTEED_PARENT, {"koordinator.sh/cpuQOS": raw}))


def test_g4_be_pod() -> None:
    ctx = pod({"koordinator.sh/qosClass": "BE"}, "kubepods/besteffort/pod-besteffort-test-uid/")
    gi().set_pod_bvt_value(ctx)
    assert ctx.response.resources.cpu_bvt == -1


@pytest.mark.parametrize("h", [gi(system=BvtSystem()), gi(rule=None)], ids=["unsupported", "nil-rule"])
def test_g5_unsupported_or_no_rule_sets_nothing(h: GroupIdentity) -> None:
    ctx = pod(LS, GUARANTEED_PARENT)
    h.set_pod_bvt_value(ctx)
    assert ctx.response.resources.cpu_bvt is None


def test_g6_rule_disabled_and_sysctl_disabled_skips() -> None:
    none_rule = parse_bvt_rule(SLOView())
    ctx = pod(LS, GUARANTEED_PARENT)
    gi(BvtSystem(bvt_file=True, sysctl_enabled=False), none_rule).set_pod_bvt_value(ctx)
    assert ctx.response.resources.cpu_bvt is None


def test_g7_enabled_rule_with_ls_zero_and_sysctl_on() -> None:
    rule = parse_bvt_rule(
        SLOView(lsr=ClassCPUQOS(True, 2), ls=ClassCPUQOS(True, 0), be=ClassCPUQOS(True, -1))
    )
    ctx = pod(LS, GUARANTEED_PARENT)
    gi(BvtSystem(bvt_file=True, sysctl_enabled=True), rule).set_pod_bvt_value(ctx)
    assert ctx.response.resources.cpu_bvt == 0


def test_g8_sysctl_read_error_skips() -> None:
    ctx = pod(LS, GUARANTEED_PARENT)
    gi(BvtSystem(bvt_file=True, sysctl_error="no such file"), parse_bvt_rule(SLOView())).set_pod_bvt_value(
        ctx
    )
    assert ctx.response.resources.cpu_bvt is None


def test_g9_kube_qos_dirs() -> None:
    got = []
    for kq, parent in (
        (KubeQoS.GUARANTEED, "kubepods"),
        (KubeQoS.BURSTABLE, "kubepods/burstable"),
        (KubeQoS.BESTEFFORT, "kubepods/besteffort"),
    ):
        ctx = KubeQoSContext(kq, parent)
        gi().set_kube_qos_bvt_value(ctx)
        got.append(ctx.response.resources.cpu_bvt)
    assert got == [0, 2, -1]


def test_g10_host_app() -> None:
    assert gi().host_app_bvt(QoSClass.LS) == 2
    assert gi().host_app_bvt(QoSClass.NONE) == 0


def test_cpu_idle_fallback_without_bvt_file() -> None:
    h = gi(BvtSystem(idle_file=True))
    be = pod({"koordinator.sh/qosClass": "BE"}, "kubepods/besteffort/podx")
    ls = pod(LS, "kubepods/burstable/pody")
    h.set_pod_bvt_value(be)
    h.set_pod_bvt_value(ls)
    assert (be.response.resources.cpu_bvt, be.response.resources.cpu_idle) == (None, 1)
    assert (ls.response.resources.cpu_bvt, ls.response.resources.cpu_idle) == (None, 0)


P1_POD = {QoSClass.LSE: 2, QoSClass.LSR: 2, QoSClass.LS: 2, QoSClass.BE: -1}
P1_DIR = {KubeQoS.GUARANTEED: 0, KubeQoS.BURSTABLE: 2, KubeQoS.BESTEFFORT: -1}
P1_KPOD = {KubeQoS.GUARANTEED: 2, KubeQoS.BURSTABLE: 2, KubeQoS.BESTEFFORT: -1}
ZERO_POD = dict.fromkeys(P1_POD, 0)
ZERO_K = dict.fromkeys(P1_DIR, 0)


@pytest.mark.parametrize(
    ("view", "pod_params", "dir_params", "kpod_params", "enable"),
    [
        (ENABLED_ALL, P1_POD, P1_DIR, P1_KPOD, True),  # P1
        (
            SLOView(ls=ClassCPUQOS(True, 2), be=ClassCPUQOS(True, -1)),
            {**P1_POD, QoSClass.LSE: 0, QoSClass.LSR: 0},
            P1_DIR,
            P1_KPOD,
            True,
        ),  # P2
        (
            SLOView(be=ClassCPUQOS(True, -1)),
            {**ZERO_POD, QoSClass.BE: -1},
            {**ZERO_K, KubeQoS.BESTEFFORT: -1},
            {**ZERO_K, KubeQoS.BESTEFFORT: -1},
            True,
        ),  # P3
        (SLOView(), ZERO_POD, ZERO_K, ZERO_K, False),  # P4
        (
            SLOView(lsr=ClassCPUQOS(False, 2), ls=ClassCPUQOS(False, 2), be=ClassCPUQOS(True, -1)),
            {**ZERO_POD, QoSClass.BE: -1},
            {**ZERO_K, KubeQoS.BESTEFFORT: -1},
            {**ZERO_K, KubeQoS.BESTEFFORT: -1},
            True,
        ),  # P5
        (
            SLOView(
                cpu_policy=None, lsr=ClassCPUQOS(True, 2), ls=ClassCPUQOS(True, 2), be=ClassCPUQOS(True, -1)
            ),
            P1_POD,
            P1_DIR,
            P1_KPOD,
            True,
        ),  # P6
        (
            SLOView(
                cpu_policy="coreSched",
                lsr=ClassCPUQOS(True, 2),
                ls=ClassCPUQOS(True, 2),
                be=ClassCPUQOS(True, -1),
            ),
            ZERO_POD,
            ZERO_K,
            ZERO_K,
            False,
        ),  # P7
    ],
    ids=["P1", "P2", "P3", "P4", "P5", "P6", "P7"],
)
def test_parse_rule(
    view: SLOView,
    pod_params: dict[QoSClass, int],
    dir_params: dict[KubeQoS, int],
    kpod_params: dict[KubeQoS, int],
    enable: bool,
) -> None:
    h = GroupIdentity(SUPPORTED)
    assert h.update_rule(view) is True
    assert h.rule is not None
    assert dict(h.rule.pod_qos_params) == pod_params
    assert dict(h.rule.kube_qos_dir_params) == dir_params
    assert dict(h.rule.kube_qos_pod_params) == kpod_params
    assert h.rule.enable is enable


def test_p8_same_rule_is_not_an_update() -> None:
    h = GroupIdentity(SUPPORTED)
    assert h.update_rule(ENABLED_ALL) is True
    assert h.update_rule(ENABLED_ALL) is False


def test_rule_from_the_shared_nodeslo_model() -> None:
    slo = parse_nodeslo(
        {
            "resourceQOSStrategy": {
                "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
                "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
                "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
            }
        }
    )
    assert parse_bvt_rule(slo_view(slo)) == DEFAULT_RULE
    assert parse_bvt_rule(slo_view(parse_nodeslo({}))).enable is False
