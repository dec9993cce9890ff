"""BatchResource: BE pods get cpu.shares, cfs quota and memory limit from batch-cpu / batch-memory.

docs/behaviour-runtime-hooks.md, "BatchResource". Kubelet sees these pods as BestEffort and would leave them
unlimited.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from koordqos.hooks.context import ContainerContext, PodContext, Stage
from koordqos.hooks.framework import BE, HookFn, HookPlugin, HookSpec, Level, Reconciler
from koordqos.hooks.resources import (
    MIN_QUOTA,
    ExtendedResources,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
)
from koordqos.hooks.rules import NodeRules, SLOView
from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY
from koordqos.model.qos import QoSClass

NAME = "BatchResource"
GATE = "BatchResource"


def scale_quota(quota: int, ratio: float) -> int:
    """CPU normalization of a positive quota: ceil(quota / ratio), only for a finite ratio > 1.

    The result never drops below koordlet's MilliCPUToQuota floor (1000 µs): a huge ratio would
    otherwise give 0 or 1, which the kernel refuses, failing every container creation it is put into.
    """
    if quota > 0 and ratio > 1.0 and math.isfinite(ratio):
        return max(math.ceil(quota / ratio), MIN_QUOTA)
    return quota


@dataclass
class BatchResourceRule:
    """cfs quota on/off (off under BE cfsQuota suppress) and the node's cpu-normalization ratio."""

    enable_cfs_quota: bool | None = None  # None means true
    cpu_normalization_ratio: float | None = None  # None means -1

    def cfs_quota_scale(self) -> tuple[bool, float]:
        """(enabled, ratio); (False, -1) when quotas are lifted."""
        if self.enable_cfs_quota is False:
            return False, -1.0
        return True, -1.0 if self.cpu_normalization_ratio is None else self.cpu_normalization_ratio

    def update_cfs_quota(self, be_threshold_enable: bool, cpu_suppress_policy: str) -> bool:
        """NodeSLO rule: quota disabled iff BE suppress is on with policy cfsQuota; True when changed."""
        enabled = not (be_threshold_enable and cpu_suppress_policy == "cfsQuota")
        if self.enable_cfs_quota is not None and self.enable_cfs_quota == enabled:
            return False
        self.enable_cfs_quota = enabled
        return True

    def update_ratio(self, ratio: float) -> bool:
        """Node rule: new normalization ratio (-1 when absent); True on first value or a change ≥ 0.01."""
        if self.cpu_normalization_ratio is not None and abs(self.cpu_normalization_ratio - ratio) < 0.01:
            return False
        self.cpu_normalization_ratio = ratio
        return True


class BatchResource(HookPlugin):
    """The hook plugin; `rule` is None until the first NodeSLO/Node update."""

    name = NAME
    gate = GATE

    def __init__(self, rule: BatchResourceRule | None = None) -> None:
        # None: no rule yet, as koordlet's nil rule (the hooks then scale nothing)
        self.rule: BatchResourceRule | None = rule if rule is not None else BatchResourceRule()

    def _rule(self) -> BatchResourceRule:
        if self.rule is None:
            self.rule = BatchResourceRule()
        return self.rule

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {
            Stage.PRE_RUN_POD_SANDBOX: ("set pod batch resources", self.set_pod_resources),
            Stage.PRE_CREATE_CONTAINER: ("set container batch resources", self.set_container_resources),
            Stage.PRE_UPDATE_CONTAINER_RESOURCES: (
                "set container batch resources",
                self.set_container_resources,
            ),
        }

    def reconcilers(self) -> list[Reconciler]:
        """BE pods: pod shares, quota and memory; container resources."""
        return [
            Reconciler(Level.POD, "cpu.shares", self.set_pod_cpu_shares, BE),
            Reconciler(Level.POD, "cpu.cfs_quota_us", self.set_pod_cfs_quota, BE),
            Reconciler(Level.POD, "memory.limit_in_bytes", self.set_pod_memory_limit, BE),
            Reconciler(Level.CONTAINER, "batch", self.set_container_resources, BE),
        ]

    def update_slo(self, view: SLOView) -> bool:
        """cfs quota off under BE cfsQuota suppress."""
        return self._rule().update_cfs_quota(view.be_threshold_enable, view.cpu_suppress_policy)

    def update_node(self, node: NodeRules) -> bool:
        """The node's cpu-normalization ratio."""
        return node.ratio is not None and self._rule().update_ratio(node.ratio)

    def _scale(self) -> tuple[bool, float]:
        return self.rule.cfs_quota_scale() if self.rule is not None else (True, -1.0)

    def set_pod_resources(self, ctx: PodContext | None) -> None:
        """Pod shares / quota / memory from the sum of the containers' batch resources."""
        if ctx is None:
            raise ValueError("nil pod context")
        req = ctx.request
        if req.qos is not QoSClass.BE or req.extended is None:
            return
        res = ctx.response.resources
        res.cpu_shares = self.pod_shares(req.extended.containers.values())
        res.cfs_quota = self.pod_quota(req.extended.containers.values())
        res.memory_limit = self.pod_memory(req.extended.containers.values())

    def set_pod_cpu_shares(self, ctx: PodContext) -> None:
        """Reconciler: pod cpu.shares only."""
        if ctx.request.qos is QoSClass.BE and ctx.request.extended is not None:
            ctx.response.resources.cpu_shares = self.pod_shares(ctx.request.extended.containers.values())

    def set_pod_cfs_quota(self, ctx: PodContext) -> None:
        """Reconciler / NodeSLO rule: pod cfs quota only."""
        if ctx.request.qos is QoSClass.BE and ctx.request.extended is not None:
            ctx.response.resources.cfs_quota = self.pod_quota(ctx.request.extended.containers.values())

    def set_pod_memory_limit(self, ctx: PodContext) -> None:
        """Reconciler: pod memory limit only."""
        if ctx.request.qos is QoSClass.BE and ctx.request.extended is not None:
            ctx.response.resources.memory_limit = self.pod_memory(ctx.request.extended.containers.values())

    @staticmethod
    def pod_shares(containers: Iterable[ExtendedResources]) -> int:
        """Shares from the sum of positive batch-cpu requests."""
        total = 0
        for c in containers:
            if c.requests is not None and c.request(BATCH_CPU) > 0:
                total += c.request(BATCH_CPU)
        return milli_cpu_to_shares(total)

    def pod_quota(self, containers: Iterable[ExtendedResources]) -> int:
        """-1 when quotas are lifted or any container lacks a positive batch-cpu limit."""
        enabled, ratio = self._scale()
        if not enabled:
            return -1
        total = 0
        for c in containers:
            if c.limits is None or c.limit(BATCH_CPU) <= 0:
                return -1
            total += c.limit(BATCH_CPU)
        return scale_quota(milli_cpu_to_quota(total), ratio)

    @staticmethod
    def pod_memory(containers: Iterable[ExtendedResources]) -> int:
        """-1 when any container lacks a positive batch-memory limit, else the sum in bytes."""
        total = 0
        for c in containers:
            if c.limits is None or c.limit(BATCH_MEMORY) <= 0:
                return -1
            total += c.limit(BATCH_MEMORY)
        return total

    def set_container_resources(self, ctx: ContainerContext | None) -> None:
        """Container shares / quota / memory from its own batch resources."""
        if ctx is None:
            raise ValueError("nil container context")
        req = ctx.request
        if req.qos is not QoSClass.BE or req.extended is None:
            return
        res = ctx.response.resources
        res.cpu_shares = self.container_shares(req.extended)
        res.cfs_quota = self.container_quota(req.extended)
        res.memory_limit = self.container_memory(req.extended)

    def set_container_cfs_quota(self, ctx: ContainerContext) -> None:
        """NodeSLO rule: container cfs quota only."""
        if ctx.request.qos is QoSClass.BE and ctx.request.extended is not None:
            ctx.response.resources.cfs_quota = self.container_quota(ctx.request.extended)

    @staticmethod
    def container_shares(ext: ExtendedResources) -> int:
        """Shares from the batch-cpu request (2 without one)."""
        return milli_cpu_to_shares(max(ext.request(BATCH_CPU), 0))

    def container_quota(self, ext: ExtendedResources) -> int:
        """Quota from the batch-cpu limit (-1 without one or when quotas are lifted)."""
        enabled, ratio = self._scale()
        if not enabled:
            return -1
        return scale_quota(milli_cpu_to_quota(max(ext.limit(BATCH_CPU), 0)), ratio)

    @staticmethod
    def container_memory(ext: ExtendedResources) -> int:
        """The batch-memory limit, -1 without one."""
        mem = ext.limit(BATCH_MEMORY)
        return mem if mem > 0 else -1


HOOK: HookSpec[BatchResource] = HookSpec(NAME, GATE, lambda opts: BatchResource())
