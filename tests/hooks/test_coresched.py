"""CoreSched: koordlet's cases K1–K14, K18, K19 (docs/behaviour-runtime-hooks.md, "CoreSched"); the cookie
cases K15–K17 are in tests/host/test_coresched.py, with the cookie caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.hooks.context import ContainerContext, ContainerRequest, KubeQoSContext
from koordqos.hooks.coresched import (
    CoreSched,
    CoreSchedRule,
    Param,
    pod_enabled_and_group,
    probe_sysfs,
)
from koordqos.hooks.rules import ClassCPUQOS, SLOView
from koordqos.model.qos import KubeQoS, QoSClass

ON = Param(True, True, False)
BE_ON = Param(True, False, False)
ENABLED_RULE = CoreSchedRule(
    enable=True,
    pod_qos_params={QoSClass.LSE: ON, QoSClass.LSR: ON, QoSClass.LS: ON, QoSClass.BE: BE_ON},
    kube_qos_pod_params={KubeQoS.GUARANTEED: ON, KubeQoS.BURSTABLE: ON, KubeQoS.BESTEFFORT: BE_ON},
)
DISABLED_RULE = CoreSchedRule(
    enable=False,
    pod_qos_params=dict.fromkeys((QoSClass.LSE, QoSClass.LSR, QoSClass.LS, QoSClass.BE), Param()),
    kube_qos_pod_params=dict.fromkeys((KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT), Param()),
)
GID = "koordinator.sh/core-sched-group-id"
POLICY = "koordinator.sh/core-sched-policy"
QOS = "koordinator.sh/qosClass"


@pytest.mark.parametrize(
    ("rule", "labels", "kube_qos", "want"),
    [
        (ENABLED_RULE, {QOS: "LS", GID: "group-xxx"}, KubeQoS.BURSTABLE, (True, "group-xxx-expeller")),  # K1
        (ENABLED_RULE, {QOS: "BE"}, KubeQoS.BESTEFFORT, (True, "")),  # K2
        (ENABLED_RULE, {}, KubeQoS.BURSTABLE, (True, "-expeller")),  # K3
        (ENABLED_RULE, None, KubeQoS.BURSTABLE, (True, "-expeller")),  # K4
        (ENABLED_RULE, {QOS: "LS", POLICY: "exclusive"}, KubeQoS.BURSTABLE, (True, "xxx-expeller")),  # K5
        (DISABLED_RULE, {GID: "group-xxx"}, KubeQoS.BURSTABLE, (False, "group-xxx")),  # K6
        (DISABLED_RULE, {QOS: "BE", GID: "group-xxx"}, KubeQoS.BESTEFFORT, (False, "group-xxx")),  # K7
        (DISABLED_RULE, {}, KubeQoS.BURSTABLE, (False, "")),  # K8
        (ENABLED_RULE, {QOS: "LS", POLICY: "none"}, KubeQoS.GUARANTEED, (False, "-expeller")),  # K9
        (
            CoreSchedRule(True, {QoSClass.LS: Param(True, False, False)}, {KubeQoS.BURSTABLE: Param(True)}),
            {QOS: "LS"},
            KubeQoS.BURSTABLE,
            (True, ""),
        ),  # K10
        (
            CoreSchedRule(False, ENABLED_RULE.pod_qos_params, ENABLED_RULE.kube_qos_pod_params),
            {QOS: "LSR"},
            KubeQoS.GUARANTEED,
            (False, ""),
        ),  # K11
    ],
    ids=["K1", "K2", "K3", "K4", "K5", "K6", "K7", "K8", "K9", "K10", "K11"],
)
def test_pod_enabled_and_group(
    rule: CoreSchedRule, labels: dict[str, str] | None, kube_qos: KubeQoS, want: tuple[bool, str]
) -> None:
    assert pod_enabled_and_group(rule, labels, "xxx", kube_qos) == want


def test_k12_parse_rule() -> None:
    view = SLOView(
        cpu_policy="coreSched", ls=ClassCPUQOS(True, 2, 0, True), be=ClassCPUQOS(True, -1, 1, False)
    )
    h = CoreSched(True, "test")
    assert h.update_rule(view) is True
    r = h.rule
    f, ls, be = Param(), Param(True, True, False), Param(True, False, True)
    assert (r.pod_qos_params[QoSClass.LSE], r.pod_qos_params[QoSClass.LSR]) == (f, f)
    assert (r.pod_qos_params[QoSClass.LS], r.pod_qos_params[QoSClass.BE]) == (ls, be)
    assert dict(r.kube_qos_pod_params) == {
        KubeQoS.GUARANTEED: ls,
        KubeQoS.BURSTABLE: ls,
        KubeQoS.BESTEFFORT: be,
    }
    assert r.enable is True


def test_k13_group_identity_policy_disables() -> None:
    h = CoreSched(True, "test")
    h.update_rule(SLOView(cpu_policy="coreSched", ls=ClassCPUQOS(True, 2, 0, True)))
    assert h.update_rule(SLOView(cpu_policy="groupIdentity", ls=ClassCPUQOS(True, 2, 0, True))) is True
    assert h.rule.enable is False
    assert all(p == Param() for p in h.rule.pod_qos_params.values())


def test_k14_kube_qos_cpu_idle() -> None:
    h = CoreSched(True, "test", idle_on_qos_dirs=True)  # koordlet's behaviour (--cpu-idle-on-qos-dirs)
    new = KubeQoSContext(KubeQoS.BURSTABLE, "kubepods/burstable")
    h.set_kube_qos_cpu_idle(new)
    assert new.response.resources.cpu_idle is None
    h.rule = DISABLED_RULE
    burst = KubeQoSContext(KubeQoS.BURSTABLE, "kubepods/burstable")
    h.set_kube_qos_cpu_idle(burst)
    assert burst.response.resources.cpu_idle == 0
    h.rule = CoreSchedRule(
        True, {QoSClass.BE: Param(True, False, True)}, {KubeQoS.BESTEFFORT: Param(True, False, True)}
    )
    be = KubeQoSContext(KubeQoS.BESTEFFORT, "kubepods/besteffort")
    h.set_kube_qos_cpu_idle(be)
    assert be.response.resources.cpu_idle == 1


def cctx(parent: str, cid: str = "containerd://abc") -> ContainerContext:
    return ContainerContext(
        ContainerRequest(pod_uid="uid", container_id=cid, pod_labels={QOS: "LS"}, cgroup_parent=parent)
    )


def test_k18_container_preconditions() -> None:
    h = CoreSched(True, "test")
    h.rule = ENABLED_RULE
    with pytest.raises(ValueError, match="cgroup parent"):
        h.container_plan(cctx(""))
    good = "kubepods.slice/kubepods-burstable.slice/p.slice/cri-containerd-abc.scope"
    assert h.container_plan(cctx(good, cid="")) is None
    assert h.container_plan(cctx(good)) == (True, "-expeller")
    h.rule = CoreSchedRule()
    assert h.container_plan(cctx(good)) is None  # rule not inited
    unsupported = CoreSched(False, "not supported by prctl")
    unsupported.rule = ENABLED_RULE
    assert unsupported.container_plan(cctx(good)) is None


def test_k19_system_supported_probe(tmp_path: Path) -> None:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    assert probe_sysfs(proc, sys) == (False, "file not exist")
    feats = sys / "kernel/debug/sched_features"
    feats.parent.mkdir(parents=True)
    feats.write_text("GENTLE_FAIR_SLEEPERS START_DEBIT\n")
    assert probe_sysfs(proc, sys)[0] is False
    feats.write_text("GENTLE_FAIR_SLEEPERS CORE_SCHED\n")
    assert probe_sysfs(proc, sys) == (True, "sched_features supported")
    sysctl = proc / "sys/kernel/sched_core"
    sysctl.parent.mkdir(parents=True)
    sysctl.write_text("0\n")
    assert probe_sysfs(proc, sys) == (True, "sysctl supported")
