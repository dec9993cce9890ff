"""Completion: turn what hooks set in a context into cgroup write intents (koordlet inject*/Done).

* pod (RunPodSandbox and reconciler): bvt, idle, shares, quota, memory at the pod dir; no shares for a pod
  made idle (`cpu.idle=1`): the kernel gives an idle group its own minimal weight and refuses a
  `cpu.shares` / `cpu.weight` write there with EINVAL (seen on a real v2 kernel: GroupIdentity's idle
  fallback and BatchResource's shares on every BE pod, a failed write every reconcile); idle is written
  before shares, as clearing it resets the weight to the default;
* container (reconciler only; NRI carries container values in the adjustment): shares, a non-empty cpuset,
  quota and memory at the container dir; nothing when the dir is unknown. Container bvt/idle are never
  written here: containers inherit the pod's value;
* kube-QoS dir: bvt and idle;
* host application (injectForOrigin, then injectForExt): a non-empty cpuset, then bvt and idle.
"""

from __future__ import annotations

from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.hooks.context import ContainerContext, HostAppContext, KubeQoSContext, PodContext
from koordqos.hooks.resources import Resources


def _ext(parent: str, res: Resources, level: Level) -> list[CgroupWrite]:
    out: list[CgroupWrite] = []
    if res.cpu_bvt is not None:
        out.append(CgroupWrite(parent, "cpu.bvt_warp_ns", res.cpu_bvt, level))
    if res.cpu_idle is not None:
        out.append(CgroupWrite(parent, "cpu.idle", res.cpu_idle, level))
    return out


def pod_writes(ctx: PodContext) -> list[CgroupWrite]:
    """Pod-level intents (injectForExt): written directly, as pod-stage replies cannot carry them."""
    parent = ctx.request.cgroup_parent
    if not parent:
        return []
    res = ctx.response.resources
    out = _ext(parent, res, Level.POD)
    if res.cpu_shares is not None and res.cpu_idle != 1:
        out.append(CgroupWrite(parent, "cpu.shares", res.cpu_shares, Level.POD))
    if res.cfs_quota is not None:
        out.append(CgroupWrite(parent, "cpu.cfs_quota_us", res.cfs_quota, Level.POD))
    if res.memory_limit is not None:
        out.append(CgroupWrite(parent, "memory.limit_in_bytes", res.memory_limit, Level.POD))
    return out


def container_writes(ctx: ContainerContext) -> list[CgroupWrite]:
    """Container-level intents for the reconciler (injectForOrigin)."""
    parent = ctx.request.cgroup_parent
    if not parent:
        return []
    res = ctx.response.resources
    out: list[CgroupWrite] = []
    if res.cpu_shares is not None:
        out.append(CgroupWrite(parent, "cpu.shares", res.cpu_shares, Level.CONTAINER))
    if res.cpuset:
        out.append(CgroupWrite(parent, "cpuset.cpus", res.cpuset, Level.CONTAINER))
    if res.cfs_quota is not None:
        out.append(CgroupWrite(parent, "cpu.cfs_quota_us", res.cfs_quota, Level.CONTAINER))
    if res.memory_limit is not None:
        out.append(CgroupWrite(parent, "memory.limit_in_bytes", res.memory_limit, Level.CONTAINER))
    return out


def kube_qos_writes(ctx: KubeQoSContext) -> list[CgroupWrite]:
    """Kube-QoS dir intents (bvt, idle)."""
    return _ext(ctx.cgroup_parent, ctx.response.resources, Level.QOS)


def host_app_writes(ctx: HostAppContext) -> list[CgroupWrite]:
    """Host application intents at its cgroup dir (nothing when the dir is unknown)."""
    parent = ctx.request.cgroup_parent
    if not parent:
        return []
    res = ctx.response.resources
    out: list[CgroupWrite] = []
    if res.cpuset:
        out.append(CgroupWrite(parent, "cpuset.cpus", res.cpuset, Level.POD))
    return out + _ext(parent, res, Level.POD)
