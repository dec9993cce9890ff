"""Cpuset strings ("0-3,8") and the scheduler's resource-status annotation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from koordqos.model import jsontext
from koordqos.model.cpuset import cpu_set, format_cpuset
from koordqos.model.quantity import to_milli
from koordqos.once import text_memo

ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"


parse_cpuset = cpu_set  # one cpu-list parser for the whole project (koordqos.model.cpuset)
__all__ = ["format_cpuset", "parse_cpuset"]


@dataclass(frozen=True, slots=True)
class NUMANodeResource:
    """One NUMA node of a pod's allocation: cpu in milli, batch-cpu as given (milli)."""

    node: int
    cpu: int = 0
    batch_cpu: int = 0


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    """The scheduler's `resource-status`: the pinned cpuset and the NUMA nodes allocated."""

    cpuset: str = ""
    numa_nodes: tuple[NUMANodeResource, ...] = ()


def parse_resource_status(annotations: Mapping[str, str] | None) -> ResourceStatus | None:
    """The pod's resource status; None when absent; ValueError on malformed content."""
    if not annotations:
        return None
    raw = annotations.get(ANNOTATION_RESOURCE_STATUS)
    if raw is None:
        return None
    try:
        return _parse_status(raw)
    except ValueError:
        raise
    except Exception as exc:  # any shape the parser did not foresee: malformed, never a crash
        raise ValueError(f"{ANNOTATION_RESOURCE_STATUS}: unreadable ({type(exc).__name__})") from None


# the memo of parsed resource-status texts: a budget of bytes, whatever the texts (koordqos.once)
STATUS_MEMO_BYTES = 64 * 1024


@text_memo(STATUS_MEMO_BYTES, max_entry=16 * 1024)
def _parse_status(raw: str) -> ResourceStatus:
    # cached by the annotation text (several hooks read it for every container of a pod)
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        raise ValueError(f"{ANNOTATION_RESOURCE_STATUS}: invalid JSON {raw[:64]!r}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{ANNOTATION_RESOURCE_STATUS}: expected an object")
    nodes: list[NUMANodeResource] = []
    for item in doc.get("numaNodeResources") or ():
        if not isinstance(item, dict):
            raise ValueError(f"{ANNOTATION_RESOURCE_STATUS}: numaNodeResources: expected objects")
        res = item.get("resources") or {}
        try:
            cpu = to_milli(res["cpu"]) if "cpu" in res else 0
            batch = (
                int(to_milli(res["kubernetes.io/batch-cpu"]) // 1000)
                if "kubernetes.io/batch-cpu" in res
                else 0
            )
        except Exception as exc:
            raise ValueError(f"{ANNOTATION_RESOURCE_STATUS}: {exc}") from None
        nodes.append(NUMANodeResource(int(item.get("node", 0)), cpu, batch))
    return ResourceStatus(str(doc.get("cpuset") or ""), tuple(nodes))


def has_pinned_cpuset(annotations: Mapping[str, str] | None) -> bool:
    """Whether the pod carries a non-empty resource-status cpuset (malformed counts as none)."""
    try:
        status = parse_resource_status(annotations)
    except ValueError:
        return False
    return status is not None and bool(status.cpuset)
