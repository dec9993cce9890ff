"""Helpers for the report tests: synthetic collection rounds with exact values."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from koordqos.metrics.types import HostAppSample, MetricSnapshot, NodeSample, PodSample
from koordqos.report.history import ReportHistory

GiB = 1 << 30


class FakeClock:
    """A settable monotonic clock."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def snapshot(
    node_cpu: float | None,
    node_mem: int | None,
    pods: Mapping[str, tuple[float | None, int | None]] | None = None,
    apps: Mapping[str, tuple[float, int]] | None = None,
    *,
    node_mem_with_cache: int | None = None,
    pod_file_pages: int = 0,
) -> MetricSnapshot:
    """One round: node cores / bytes, pods uid → (cores, anon bytes), apps name → (cores, bytes)."""
    pod_samples = {
        uid: PodSample(
            uid,
            cpu,
            None if mem is None else mem + pod_file_pages,
            (),
            mem,
            None if mem is None else mem + pod_file_pages,
        )
        for uid, (cpu, mem) in (pods or {}).items()
    }
    app_samples = {
        name: HostAppSample(name, f"host/{name}", cpu, mem, mem, mem)
        for name, (cpu, mem) in (apps or {}).items()
    }
    return MetricSnapshot(
        at=0.0,
        interval=1.0,
        node=NodeSample(
            cpu_usage_cores=node_cpu,
            memory_used=node_mem,
            memory_used_with_cache=node_mem_with_cache if node_mem_with_cache is not None else node_mem,
        ),
        pods=MappingProxyType(pod_samples),
        host_apps=MappingProxyType(app_samples),
    )


def feed(history: ReportHistory, clock: FakeClock, seconds: int, snap: MetricSnapshot) -> None:
    """`seconds` rounds of the same snapshot, one per second."""
    for _ in range(seconds):
        clock.t += 1.0
        history.ingest(snap)
