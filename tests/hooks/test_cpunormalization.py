"""CPUNormalization: koordlet's cases N1–N9 (docs/behaviour-runtime-hooks.md, "CPUNormalization"); N10–N11
are in test_reconciler.py."""

from __future__ import annotations

import pytest

from koordqos.hooks.context import ContainerContext, ContainerRequest, PodContext, PodRequest
from koordqos.hooks.cpunormalization import CPUNormalization, is_pod_cpu_share
from koordqos.hooks.resources import Resources
from koordqos.hooks.rules import RatioIgnored, RuleError, cpu_normalization_ratio
from koordqos.model.node import NodeInfo

LS = {"koordinator.sh/qosClass": "LS"}


def hook(enable: bool, ratio: float) -> CPUNormalization:
    h = CPUNormalization()
    h.enable, h.ratio = enable, ratio
    return h


def both(labels: dict[str, str], res: Resources | None) -> tuple[PodContext, ContainerContext]:
    return (
        PodContext(PodRequest(uid="u", labels=labels, resources=res)),
        ContainerContext(ContainerRequest(pod_uid="u", pod_labels=labels, resources=res)),
    )


def run(h: CPUNormalization, labels: dict[str, str], res: Resources | None) -> tuple[int | None, int | None]:
    p, c = both(labels, res)
    h.adjust_pod_cfs_quota(p)
    h.adjust_container_cfs_quota(c)
    return p.response.resources.cfs_quota, c.response.resources.cfs_quota


def test_n1_nil_contexts_are_errors() -> None:
    with pytest.raises(ValueError, match="nil"):
        hook(True, 1.2).adjust_pod_cfs_quota(None)
    with pytest.raises(ValueError, match="nil"):
        hook(True, 1.2).adjust_container_cfs_quota(None)


def test_n2_no_request_resources() -> None:
    assert run(hook(True, 1.2), LS, None) == (None, None)


def test_n3_be_untouched() -> None:
    res = Resources(cpu_shares=1024, cfs_quota=100000)
    assert run(hook(True, 1.2), {"koordinator.sh/qosClass": "BE"}, res) == (None, None)


def test_n4_disabled_rule() -> None:
    assert run(hook(False, -1), LS, Resources(cfs_quota=100000)) == (None, None)


@pytest.mark.parametrize(
    ("ratio", "want"), [(1.2, 83334), (1.0, 100000), (0.0, 100000)], ids=["N5", "N6", "N7"]
)
def test_n5_n6_n7_scaling(ratio: float, want: int) -> None:
    assert run(hook(True, ratio), LS, Resources(cfs_quota=100000)) == (want, want)


def test_unlimited_quota_untouched() -> None:
    assert run(hook(True, 1.2), LS, Resources(cfs_quota=-1)) == (None, None)


def test_n8_is_pod_cpu_share() -> None:
    assert is_pod_cpu_share(None, None) is True
    assert is_pod_cpu_share({}, {}) is True
    assert is_pod_cpu_share(LS, {}) is True
    assert is_pod_cpu_share({"koordinator.sh/qosClass": "LSE"}, {}) is False
    assert (
        is_pod_cpu_share({}, {"scheduling.koordinator.sh/resource-status": '{"cpuset": "2-3,34-35"}'})
        is False
    )


def node(ann: dict[str, str]) -> NodeInfo:
    return NodeInfo(name="n", annotations=ann)


def test_n9_parse_rule() -> None:
    key = "node.koordinator.sh/cpu-normalization-ratio"
    with pytest.raises(RuleError):
        cpu_normalization_ratio(None)
    with pytest.raises(RuleError):
        cpu_normalization_ratio(node({key: "[}"}))
    with pytest.raises(RuleError):
        cpu_normalization_ratio(node({key: "0"}))
    h = CPUNormalization()
    assert h.ratio == -1
    assert cpu_normalization_ratio(node({})) == -1
    assert h.update_rule(cpu_normalization_ratio(node({key: "1.10"}))) is True
    assert h.ratio == pytest.approx(1.1)
    assert h.enable
    assert h.update_rule(cpu_normalization_ratio(node({key: "1.10"}))) is False


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "Infinity"])
def test_non_finite_ratio_is_ignored(raw: str) -> None:
    key = "node.koordinator.sh/cpu-normalization-ratio"
    with pytest.raises(RatioIgnored, match="not finite"):
        cpu_normalization_ratio(node({key: raw}))


def test_non_finite_ratio_disables_normalization_and_is_reported_once() -> None:
    from structlog.testing import capture_logs

    from koordqos import observability as obs
    from koordqos.hooks.runtime import HookOptions, RuntimeHooks

    key = "node.koordinator.sh/cpu-normalization-ratio"
    hooks = RuntimeHooks(HookOptions(gates={"CPUNormalization": True}))
    hooks.refresh_rules(None, node({key: "1.2"}))
    assert hooks.cpu_normalization is not None
    assert hooks.cpu_normalization.enable
    counter = obs.ERRORS.labels("hooks", "bad_node_annotation")
    before = counter._value.get()
    with capture_logs() as logs:
        # every Node update is a new object: the rule is re-parsed each time
        hooks.refresh_rules(None, node({key: "inf"}))
        hooks.refresh_rules(None, node({key: "inf"}))
    assert (hooks.cpu_normalization.enable, hooks.cpu_normalization.ratio) == (False, -1)
    assert hooks.batch is not None
    assert hooks.batch.rule.cpu_normalization_ratio == -1
    assert len([e for e in logs if "ratio ignored" in e["event"]]) == 1
    assert counter._value.get() == before + 2
    p, c = both(LS, Resources(cfs_quota=100000))
    hooks.cpu_normalization.adjust_pod_cfs_quota(p)
    hooks.cpu_normalization.adjust_container_cfs_quota(c)
    assert (p.response.resources.cfs_quota, c.response.resources.cfs_quota) == (None, None)


def test_huge_ratio_never_scales_below_the_minimum_quota() -> None:
    # 1e9 is finite and > 1: ceil(100000 / 1e9) = 1 would be refused by the kernel
    assert run(hook(True, 1e9), LS, Resources(cfs_quota=100000)) == (1000, 1000)
    assert run(hook(True, 1000.0), LS, Resources(cfs_quota=200000)) == (1000, 1000)
