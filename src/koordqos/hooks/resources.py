"""Resources: the request/response resource fields hooks read and set, and koordlet's cpu conversions.

A field left at None means "do not touch" (docs/behaviour-runtime-hooks.md, "Resources and conversions").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from koordqos.errors import ModelError
from koordqos.model import jsontext
from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.quantity import to_int
from koordqos.once import text_memo

CFS_BASE_PERIOD = 100_000
MIN_SHARES = 2
MAX_SHARES = 262_144
MIN_QUOTA = 1000

ANNOTATION_EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"


def milli_cpu_to_shares(milli: int) -> int:
    """koordlet MilliCPUToShares: m*1024/1000 clamped to [2, 262144]; m <= 0 gives 2."""
    if milli <= 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli * 1024 // 1000))


def milli_cpu_to_quota(milli: int) -> int:
    """koordlet MilliCPUToQuota: m*100 µs per 100 ms period; <= 0 is -1 (unlimited); small ones → 1000."""
    quota = milli * CFS_BASE_PERIOD // 1000
    if quota <= 0:
        return -1
    return max(quota, MIN_QUOTA)


# Classes built on every NRI call declare their `__init__` (`init=False`): compiled, mypyc makes an explicit
# one native, while the one `dataclass` generates stays interpreted (≈ 0.6 µs a construction).
@dataclass(slots=True, init=False)
class Resources:
    """Cgroup-level resources a context carries (request) or a hook sets (response)."""

    cpu_shares: int | None
    cfs_quota: int | None
    cpuset: str | None
    memory_limit: int | None
    cpu_bvt: int | None
    cpu_idle: int | None

    def __init__(
        self,
        cpu_shares: int | None = None,
        cfs_quota: int | None = None,
        cpuset: str | None = None,
        memory_limit: int | None = None,
        cpu_bvt: int | None = None,
        cpu_idle: int | None = None,
    ) -> None:
        self.cpu_shares = cpu_shares
        self.cfs_quota = cfs_quota
        self.cpuset = cpuset
        self.memory_limit = memory_limit
        self.cpu_bvt = cpu_bvt
        self.cpu_idle = cpu_idle

    def is_origin_set(self) -> bool:
        """Whether any of shares, quota, cpuset or memory limit is set (the CRI/NRI-visible fields)."""
        return (
            self.cpu_shares is not None
            or self.cfs_quota is not None
            or self.cpuset is not None
            or self.memory_limit is not None
        )

    def is_set(self) -> bool:
        """Whether any field is set."""
        return self.is_origin_set() or self.cpu_bvt is not None or self.cpu_idle is not None


def resources_from_pod(pod: PodInfo) -> Resources:
    """Pod-level effective resources (reconciler): shares from cpu requests, quota/memory from limits.

    Init containers count as max(sum of containers, largest init container), as Kubernetes does.
    """
    req_cpu = max(
        sum(c.requests.get("cpu", 0) for c in pod.containers),
        max((c.requests.get("cpu", 0) for c in pod.init_containers), default=0),
    )
    lim_cpu = _pod_limit(pod, "cpu")
    lim_mem = _pod_limit(pod, "memory")
    return Resources(
        cpu_shares=milli_cpu_to_shares(req_cpu),
        cfs_quota=milli_cpu_to_quota(lim_cpu),
        memory_limit=lim_mem if lim_mem > 0 else -1,
    )


def _pod_limit(pod: PodInfo, resource: str) -> int:
    total = 0
    for c in pod.containers:
        v = c.limits.get(resource, 0)
        if v <= 0:
            return 0  # one unlimited container makes the pod unlimited
        total += v
    init_max = max((c.limits.get(resource, 0) for c in pod.init_containers), default=0)
    return max(total, init_max)


def resources_from_container(container: ContainerInfo) -> Resources:
    """Container requests/limits (reconciler): shares from requests.cpu, quota and memory from limits."""
    mem = container.limits.get("memory", 0)
    return Resources(
        cpu_shares=milli_cpu_to_shares(container.requests.get("cpu", 0)),
        cfs_quota=milli_cpu_to_quota(container.limits.get("cpu", 0)),
        memory_limit=mem if mem > 0 else -1,
    )


@dataclass(frozen=True, slots=True)
class ExtendedResources:
    """One container's batch resources: batch-cpu in milli-cores, batch-memory in bytes (absent = None)."""

    requests: Mapping[str, int] | None = None
    limits: Mapping[str, int] | None = None

    def request(self, name: str) -> int:
        """Request of `name` (0 when requests are absent or the resource is missing)."""
        return 0 if self.requests is None else self.requests.get(name, 0)

    def limit(self, name: str) -> int:
        """Limit of `name` (0 when limits are absent or the resource is missing)."""
        return 0 if self.limits is None else self.limits.get(name, 0)


@dataclass(frozen=True, slots=True)
class ExtendedResourceSpec:
    """Batch resources of every container of a pod, by container name."""

    containers: Mapping[str, ExtendedResources] = field(default_factory=dict)


_BATCH = (BATCH_CPU, BATCH_MEMORY)


def _batch_only(values: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in values.items() if k in _BATCH}


def extended_from_pod_spec(pod: PodInfo) -> ExtendedResourceSpec | None:
    """Batch resources from the pod spec; None when no container requests or limits any batch resource."""
    found = False
    containers: dict[str, ExtendedResources] = {}
    for c in pod.containers:
        req = _batch_only(c.requests)
        lim = _batch_only(c.limits)
        found = found or bool(req) or bool(lim)
        containers[c.name] = ExtendedResources(req or None, lim or None)
    return ExtendedResourceSpec(containers) if found else None


class ExtendedResourceSpecError(ValueError):
    """The extended-resource-spec annotation is not valid."""


def extended_from_annotation(annotations: Mapping[str, str]) -> ExtendedResourceSpec | None:
    """Parse `node.koordinator.sh/extended-resource-spec`; None when absent or without `containers`.

    Raises ExtendedResourceSpecError on bad JSON (also nesting too deep to decode) or quantities, and on
    nothing else.
    """
    raw = annotations.get(ANNOTATION_EXTENDED_RESOURCE_SPEC)
    if not raw:
        return None
    try:
        return _parse_extended(raw)
    except ExtendedResourceSpecError:
        raise
    except Exception as exc:  # any other failure on this text is a malformed annotation too, never a crash
        raise ExtendedResourceSpecError(
            f"{ANNOTATION_EXTENDED_RESOURCE_SPEC}: unreadable ({type(exc).__name__})"
        ) from None


# the memo of parsed extended-resource-spec texts: a budget of bytes, whatever the texts (koordqos.once)
EXTENDED_MEMO_BYTES = 64 * 1024


@text_memo(EXTENDED_MEMO_BYTES, max_entry=16 * 1024)
def _parse_extended(raw: str) -> ExtendedResourceSpec | None:
    # cached by the annotation text: every container of a pod (and every Synchronize) carries the same one
    try:
        doc = jsontext.loads(raw)
    except ValueError as exc:
        raise ExtendedResourceSpecError(f"{ANNOTATION_EXTENDED_RESOURCE_SPEC}: invalid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("containers"), dict):
        return None
    out: dict[str, ExtendedResources] = {}
    for name, spec in doc["containers"].items():
        if not isinstance(spec, dict):
            raise ExtendedResourceSpecError(
                f"{ANNOTATION_EXTENDED_RESOURCE_SPEC}: container {name!r}: not an object"
            )
        out[str(name)] = ExtendedResources(_quantities(spec.get("requests")), _quantities(spec.get("limits")))
    return ExtendedResourceSpec(MappingProxyType(out))


def _quantities(values: object) -> dict[str, int] | None:
    if values is None:
        return None
    if not isinstance(values, dict):
        raise ExtendedResourceSpecError(f"{ANNOTATION_EXTENDED_RESOURCE_SPEC}: resources must be an object")
    out: dict[str, int] = {}
    for k, v in values.items():
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            raise ExtendedResourceSpecError(
                f"{ANNOTATION_EXTENDED_RESOURCE_SPEC}: {k}: invalid quantity {v!r}"
            )
        try:
            out[str(k)] = to_int(v)
        except ModelError as exc:
            raise ExtendedResourceSpecError(f"{ANNOTATION_EXTENDED_RESOURCE_SPEC}: {k}: {exc}") from None
    return out
