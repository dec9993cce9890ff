"""The NodeState records of the runtime's objects: a `RuntimeSandbox` from an NRI PodSandbox, a
`RuntimeContainer` from an NRI Container.

Built on every container call, so this module is in the compiled hot path (`tools/compile.py`), apart from
the call classes of `koordqos.nri.calls` (which mypyc does not compile).
"""

from __future__ import annotations

from koordqos.events.types import RuntimeContainer, RuntimeSandbox
from koordqos.nri.api import nri_api_pb2 as api

__all__ = ["container_state_name", "runtime_container", "runtime_sandbox"]

_STATE_NAMES: dict[int, str] = {
    int(api.CONTAINER_CREATED): "created",
    int(api.CONTAINER_PAUSED): "paused",
    int(api.CONTAINER_RUNNING): "running",
    int(api.CONTAINER_STOPPED): "stopped",
}


def container_state_name(state: int) -> str:
    """NRI ContainerState as a lower-case word ("" when unknown)."""
    return _STATE_NAMES.get(int(state), "")


def runtime_sandbox(pod: api.PodSandbox) -> RuntimeSandbox:
    """The NodeState record for an NRI PodSandbox."""
    return RuntimeSandbox(
        id=pod.id,
        uid=pod.uid,
        name=pod.name,
        namespace=pod.namespace,
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        cgroup_parent=pod.linux.cgroup_parent,
    )


def runtime_container(ctr: api.Container, pod_uid: str, state: str | None = None) -> RuntimeContainer:
    """The NodeState record for an NRI Container (`state` overrides the message's state)."""
    linux = ctr.linux  # each field access is a by-name lookup in upb: read every message once
    res = linux.resources
    cpu, mem = res.cpu, res.memory
    return RuntimeContainer(
        id=ctr.id,
        sandbox_id=ctr.pod_sandbox_id,
        pod_uid=pod_uid,
        name=ctr.name,
        cgroups_path=linux.cgroups_path,
        pid=ctr.pid,
        state=container_state_name(ctr.state) if state is None else state,
        cpu_shares=int(cpu.shares.value),
        cpu_quota=int(cpu.quota.value),
        cpu_period=int(cpu.period.value),
        memory_limit=int(mem.limit.value),
    )
