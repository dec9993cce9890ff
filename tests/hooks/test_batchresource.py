"""BatchResource: koordlet's cases B1–B15, R1–R5 (docs/behaviour-runtime-hooks.md, "BatchResource")."""

from __future__ import annotations

import pytest

from koordqos.hooks.batchresource import BatchResource, BatchResourceRule
from koordqos.hooks.context import ContainerContext, ContainerRequest, PodContext, PodRequest
from koordqos.hooks.resources import ExtendedResources, ExtendedResourceSpec, milli_cpu_to_quota
from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY

GI = 1024**3
BE = {"koordinator.sh/qosClass": "BE"}


def batch(cpu: int, mem: int) -> dict[str, int]:
    return {BATCH_CPU: cpu, BATCH_MEMORY: mem}


C0 = ExtendedResources(batch(500, 2 * GI), batch(500, 2 * GI))
C1_LIMITS_ONLY = ExtendedResources(None, batch(1000, 2 * GI))
C_REQUESTS_ONLY = ExtendedResources(batch(500, 2 * GI), None)


def pod_ctx(*containers: ExtendedResources, labels: dict[str, str] | None = None) -> PodContext:
    spec = ExtendedResourceSpec({f"c{i}": c for i, c in enumerate(containers)})
    return PodContext(PodRequest(uid="u", labels=BE if labels is None else labels, extended=spec))


def ctr_ctx(ext: ExtendedResources | None) -> ContainerContext:
    return ContainerContext(ContainerRequest(pod_uid="u", container_name="c0", pod_labels=BE, extended=ext))


def hook(cfs: bool = True, ratio: float = -1.0) -> BatchResource:
    return BatchResource(BatchResourceRule(enable_cfs_quota=cfs, cpu_normalization_ratio=ratio))


def triple(ctx: PodContext | ContainerContext) -> tuple[int | None, int | None, int | None]:
    r = ctx.response.resources
    return r.cpu_shares, r.cfs_quota, r.memory_limit


def test_b1_nil_pod_context_is_an_error() -> None:
    with pytest.raises(ValueError, match="nil"):
        hook().set_pod_resources(None)


def test_b2_no_qos_label_sets_nothing_even_without_rule() -> None:
    h = BatchResource()
    h.rule = None
    ctx = pod_ctx(C0, labels={})
    h.set_pod_resources(ctx)
    assert not ctx.response.resources.is_set()


def test_b3_be_without_extended_resources_sets_nothing() -> None:
    ctx = PodContext(
        PodRequest(uid="u", labels=BE, annotations={"node.koordinator.sh/extended-resource-spec": "{}"})
    )
    hook().set_pod_resources(ctx)
    assert not ctx.response.resources.is_set()


@pytest.mark.parametrize(
    ("containers", "cfs", "ratio", "expected"),
    [
        ((C0,), True, -1.0, (512, 50000, 2 * GI)),  # B4
        ((C0,), False, -1.0, (512, -1, 2 * GI)),  # B5
        ((C0, C1_LIMITS_ONLY), True, -1.0, (512, 150000, 4 * GI)),  # B6
        ((C_REQUESTS_ONLY,), True, -1.0, (512, -1, -1)),  # B7
        ((C0, C_REQUESTS_ONLY), True, -1.0, (1024, -1, -1)),  # B8
        ((C0,), True, 1.2, (512, 41667, 2 * GI)),  # B9
    ],
    ids=["B4", "B5", "B6", "B7", "B8", "B9"],
)
def test_pod_level(
    containers: tuple[ExtendedResources, ...], cfs: bool, ratio: float, expected: tuple[int, int, int]
) -> None:
    ctx = pod_ctx(*containers)
    hook(cfs, ratio).set_pod_resources(ctx)
    assert triple(ctx) == expected


@pytest.mark.parametrize(
    ("ext", "cfs", "ratio", "expected"),
    [
        (C0, True, -1.0, (512, 50000, 2 * GI)),  # B10
        (C1_LIMITS_ONLY, True, -1.0, (2, 100000, 2 * GI)),  # B11
        (C0, False, -1.0, (512, -1, 2 * GI)),  # B13
        (C0, True, 1.2, (512, 41667, 2 * GI)),  # B14
    ],
    ids=["B10", "B11", "B13", "B14"],
)
def test_container_level(
    ext: ExtendedResources, cfs: bool, ratio: float, expected: tuple[int, int, int]
) -> None:
    ctx = ctr_ctx(ext)
    hook(cfs, ratio).set_container_resources(ctx)
    assert triple(ctx) == expected


def test_b12_container_without_extended_resources_sets_nothing() -> None:
    ctx = ctr_ctx(None)
    hook().set_container_resources(ctx)
    assert not ctx.response.resources.is_set()


def test_b15_batch_cpu_limit_2000_gives_quota_200000() -> None:
    ctx = ctr_ctx(ExtendedResources(batch(2000, 4 * GI), batch(2000, 4 * GI)))
    hook().set_container_resources(ctx)
    assert ctx.response.resources.cfs_quota == 200000 == milli_cpu_to_quota(2000)
    assert ctx.response.resources.memory_limit == 4294967296


def test_nil_container_context_is_an_error() -> None:
    with pytest.raises(ValueError, match="nil"):
        hook().set_container_resources(None)


def test_r1_r2_r3_nodeslo_rule_updates() -> None:
    rule = BatchResourceRule()
    assert rule.update_cfs_quota(False, "cpuset") is True  # R1: first time
    assert rule.enable_cfs_quota is True
    assert rule.update_cfs_quota(True, "cfsQuota") is True  # R2
    assert rule.enable_cfs_quota is False
    assert rule.update_cfs_quota(True, "cfsQuota") is False  # R3


def test_node_ratio_rule_updates_only_on_change_of_one_percent() -> None:
    rule = BatchResourceRule()
    assert rule.update_ratio(-1) is True
    assert rule.update_ratio(1.2) is True
    assert rule.update_ratio(1.205) is False
    assert rule.cfs_quota_scale() == (True, 1.2)


def test_r4_r5_reconcile_quota_setters_follow_the_rule() -> None:
    ext = ExtendedResources(batch(500, 2 * GI), batch(500, 2 * GI))
    on, off = hook(True), hook(False)
    for h, want in ((on, 50000), (off, -1)):
        pctx, cctx = pod_ctx(ext), ctr_ctx(ext)
        h.set_pod_cfs_quota(pctx)
        h.set_container_cfs_quota(cctx)
        assert pctx.response.resources.cfs_quota == want
        assert cctx.response.resources.cfs_quota == want
        assert pctx.response.resources.cpu_shares is None  # only the quota is touched
    # R5: a nil rule behaves as cfs enabled without ratio; an LS pod is never touched
    ls = pod_ctx(ext, labels={"koordinator.sh/qosClass": "LS"})
    on.set_pod_cfs_quota(ls)
    assert ls.response.resources.cfs_quota is None


def test_is_pod_be_by_label() -> None:
    for labels, want in ((BE, True), ({"koordinator.sh/qosClass": "LS"}, False), ({}, False)):
        ctx = pod_ctx(C0, labels=labels)
        hook().set_pod_resources(ctx)
        assert ctx.response.resources.is_set() is want


@pytest.mark.parametrize("ratio", [1e9, 1e6, float("inf"), float("nan")])
def test_normalized_be_quota_never_below_the_kernel_minimum(ratio: float) -> None:
    """A node ratio of 1e9 (or a non-finite one that slipped through) must not yield quota 0 or 1."""
    from koordqos.hooks.batchresource import scale_quota
    from koordqos.hooks.resources import MIN_QUOTA

    h = hook(ratio=ratio)
    c = ctr_ctx(C0)
    h.set_container_resources(c)
    p = pod_ctx(C0, C0)
    h.set_pod_resources(p)
    assert c.response.resources.cfs_quota is not None
    assert c.response.resources.cfs_quota >= MIN_QUOTA
    assert p.response.resources.cfs_quota is not None
    assert p.response.resources.cfs_quota >= MIN_QUOTA
    assert scale_quota(50000, ratio) >= MIN_QUOTA
    assert scale_quota(-1, ratio) == -1  # unlimited stays unlimited


def test_scale_quota_floor_only_applies_to_scaled_values() -> None:
    from koordqos.hooks.batchresource import scale_quota

    assert scale_quota(100000, 1e9) == 1000
    assert scale_quota(100000, 1.2) == 83334
    assert scale_quota(100000, 1.0) == 100000
