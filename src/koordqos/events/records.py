"""The runtime's objects as NodeState holds them: `RuntimeSandbox`, `RuntimeContainer` (NRI).

Their own module, apart from the event classes of `events/types.py`, so that the compiled build
(`tools/compile.py`) compiles them: one is built on every NRI container call, and compiled, with the
`__init__` declared here, its construction is native (≈ 50 ns) where the `__init__` that `dataclass`
generates stays interpreted even in a compiled module (≈ 1.5 µs for a frozen class of 11 fields: one
`object.__setattr__` call per field). Frozen, `replace()` and `fields()` are the dataclass's as
before; the declared `__init__` takes the same arguments with the same defaults, and `RuntimeContainer`'s
declared `__eq__` and `__hash__` use the same fields as the dataclass's would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, init=False)
class RuntimeSandbox:
    """A pod sandbox as the container runtime reports it (NRI)."""

    id: str
    uid: str
    name: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""

    def __init__(
        self,
        id: str,
        uid: str,
        name: str,
        namespace: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        cgroup_parent: str = "",
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "uid", uid)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "namespace", namespace)
        object.__setattr__(self, "labels", {} if labels is None else labels)
        object.__setattr__(self, "annotations", {} if annotations is None else annotations)
        object.__setattr__(self, "cgroup_parent", cgroup_parent)


@dataclass(frozen=True, slots=True, init=False)
class RuntimeContainer:
    """A container as the container runtime reports it (NRI)."""

    id: str
    sandbox_id: str
    pod_uid: str
    name: str
    cgroups_path: str = ""
    pid: int = 0
    state: str = ""
    # Linux resources the runtime holds for the container (0 = not set): local mode derives the
    # container's requests and limits from them
    cpu_shares: int = 0
    cpu_quota: int = 0  # µs per period; -1 unlimited
    cpu_period: int = 0  # µs
    memory_limit: int = 0  # bytes; -1 unlimited

    def __init__(
        self,
        id: str,
        sandbox_id: str,
        pod_uid: str,
        name: str,
        cgroups_path: str = "",
        pid: int = 0,
        state: str = "",
        cpu_shares: int = 0,
        cpu_quota: int = 0,
        cpu_period: int = 0,
        memory_limit: int = 0,
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "sandbox_id", sandbox_id)
        object.__setattr__(self, "pod_uid", pod_uid)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "cgroups_path", cgroups_path)
        object.__setattr__(self, "pid", pid)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "cpu_shares", cpu_shares)
        object.__setattr__(self, "cpu_quota", cpu_quota)
        object.__setattr__(self, "cpu_period", cpu_period)
        object.__setattr__(self, "memory_limit", memory_limit)

    def __eq__(self, other: object) -> bool:
        # the dataclass's, declared so that it is compiled too: the agent compares the record of every
        # container call with the one NodeState holds
        if type(other) is not RuntimeContainer:
            return NotImplemented
        return (
            self.id == other.id
            and self.sandbox_id == other.sandbox_id
            and self.pod_uid == other.pod_uid
            and self.name == other.name
            and self.cgroups_path == other.cgroups_path
            and self.pid == other.pid
            and self.state == other.state
            and self.cpu_shares == other.cpu_shares
            and self.cpu_quota == other.cpu_quota
            and self.cpu_period == other.cpu_period
            and self.memory_limit == other.memory_limit
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.id,
                self.sandbox_id,
                self.pod_uid,
                self.name,
                self.cgroups_path,
                self.pid,
                self.state,
                self.cpu_shares,
                self.cpu_quota,
                self.cpu_period,
                self.memory_limit,
            )
        )
