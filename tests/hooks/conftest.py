"""Shared fixtures for the runtime-hook tests: a synthetic node and a reconciler over it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from koordqos.cgroups.executor import CgroupExecutor
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.decisions import DecisionLog
from koordqos.hooks import probe_bvt_system
from koordqos.hooks.reconcile_plan import CLUSTER_POD_SOURCES
from koordqos.hooks.reconciler import HookReconciler
from koordqos.hooks.runtime import HookOptions, RuntimeHooks
from koordqos.host import HostActuator
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.testing.nodefs import SyntheticNode

GI = 1 << 30


def make_node(
    tmp_path: Path,
    version: CgroupVersion = CgroupVersion.V1,
    extensions: Iterable[str] = ("cpu.bvt_warp_ns",),
) -> SyntheticNode:
    return SyntheticNode(tmp_path / "node", version, CgroupDriver.CGROUPFS, extensions=extensions)


def make_reconciler(
    node: SyntheticNode,
    gates: Mapping[str, bool] | None = None,
    dry_run: bool = False,
    pod_sources: frozenset[str] = CLUSTER_POD_SOURCES,
) -> HookReconciler:
    decisions = DecisionLog(dry_run=dry_run)
    executor = CgroupExecutor(node.layout, decisions)
    hooks = RuntimeHooks(
        HookOptions(gates=dict(gates or {}), bvt=probe_bvt_system(node.layout, node.proc_root))
    )
    host = HostActuator(decisions, proc_root=node.proc_root, sys_root=node.sys_root)
    return HookReconciler(hooks, node.layout, executor, host, decisions, pod_sources=pod_sources)


def pod(
    uid: str,
    qos: str | None,
    kube_qos: KubeQoS,
    containers: Iterable[ContainerInfo] = (),
    annotations: Mapping[str, str] | None = None,
    phase: str = "Running",
    init: Iterable[ContainerInfo] = (),
) -> PodInfo:
    labels = {"koordinator.sh/qosClass": qos} if qos is not None else {}
    return PodInfo(
        uid=uid,
        namespace="ns",
        name=uid,
        labels=labels,
        annotations=dict(annotations or {}),
        kube_qos=kube_qos,
        containers=tuple(containers),
        init_containers=tuple(init),
        phase=phase,
    )
