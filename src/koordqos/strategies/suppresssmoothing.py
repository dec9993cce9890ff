"""Keeping CPU suppress steady (Project decision, docs/cpu-suppress-stability.md).

koordlet computes the BE cap from the *last* usage sample and rewrites the quota whenever it moves by 1 % of
the node. At a 1 s interval that sample spans a second; at 0.1 s it spans 100 ms, where /proc/stat's
10 ms tick accounting alone makes the node's usage jump by up to a tenth of a CPU per CPU. Pod usage comes
from cgroup counters (nanoseconds) and is exact, so the jitter lands in "system usage" (node − pods); the
cap follows it down at once (cuts are not step-limited) and climbs back in 10 % steps: a saw-tooth between
the floor and the target, and LS latency worse than without the agent.

Two remedies, each behind its own flag (0 = koordlet's behaviour):
* `smoothed_node_used`: the *system* part of the usage (node − pods) is the mean over the samples of the
  last `window` seconds (default 5 s), while pod usage stays the last sample. A pod's surge is still seen,
  and cut, in one tick; /proc/stat's jitter is averaged away; a surge of non-pod work is followed over the
  window instead of at once. With one sample in the window the result is exactly the last node sample.
* `QuotaHysteresis`: a quota change smaller than `hysteresis` % of the node's capacity does not start a
  move; once a move starts it runs to the target (a step-limited recovery is not left short of it). Cuts
  larger than the band and the first cap from "unlimited" pass at once; recovery stays step-limited (10 %).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind

DEFAULT_USAGE_WINDOW_SECONDS = 5.0
DEFAULT_HYSTERESIS_PERCENT = 5.0
CFS_PERIOD = 100_000
UNSET_QUOTA = -1


def window_samples(window_seconds: float, collect_interval: float) -> int:
    """How many of the newest samples a `window_seconds` window holds (at least 1; 0 s: just the last)."""
    if window_seconds <= 0 or collect_interval <= 0:
        return 1
    return max(1, round(window_seconds / collect_interval))


def recent_mean(store: MetricStore, kind: MetricKind, key: str = "", samples: int = 1) -> float | None:
    """Mean of the newest `samples` samples; None when even the last one is missing or stale (as `last`)."""
    newest = store.last(kind, key)
    if newest is None or samples <= 1:
        return newest
    values = store.values(kind, key, window=(samples + 1) * store.collect_interval)[-samples:]
    return sum(values) / len(values) if values else newest


def smoothed_node_used(store: MetricStore, pod_uids: Iterable[str], samples: int) -> float | None:
    """Node usage whose non-pod part is the window mean: last pods + mean(node) − mean(pods).

    The window shrinks to the samples every measured pod has: a pod measured for the first time would
    otherwise leave its earlier, unmeasured usage in the node's mean as "system" usage for a whole window.
    """
    node_last = store.last(MetricKind.NODE_CPU_USAGE)
    if node_last is None or samples <= 1:
        return node_last
    span = (samples + 1) * store.collect_interval
    pods: list[tuple[float, list[float]]] = []
    for uid in pod_uids:
        last = store.last(MetricKind.POD_CPU_USAGE, uid)
        if last is not None:
            pods.append((last, store.values(MetricKind.POD_CPU_USAGE, uid, window=span)))
    return _combine(store, node_last, pods, samples, span)


def _combine(
    store: MetricStore, node_last: float, pods: list[tuple[float, list[float]]], samples: int, span: float
) -> float:
    node_values = store.values(MetricKind.NODE_CPU_USAGE, "", window=span)
    n = min([samples, len(node_values), *(len(v) for _, v in pods)])
    if n <= 1:
        return node_last
    node_mean = sum(node_values[-n:]) / n
    pods_last = sum(last for last, _ in pods)
    pods_mean = sum(sum(v[-n:]) / n for _, v in pods)
    return node_mean - pods_mean + pods_last


def suppress_usage(
    store: MetricStore, pod_uids: Iterable[str], samples: int
) -> tuple[float | None, dict[str, float]]:
    """(node usage for the split, last usage by pod uid): what one CPU-suppress round reads."""
    pod_used: dict[str, float] = {}
    for uid in pod_uids:
        v = store.last(MetricKind.POD_CPU_USAGE, uid)
        if v is not None:
            pod_used[uid] = v
    return smoothed_node_used(store, pod_used, samples), pod_used


async def suppress_usage_paced(
    store: MetricStore, pod_uids: Iterable[str], samples: int, pace: Callable[[], Awaitable[None]]
) -> tuple[float | None, dict[str, float]]:
    """`suppress_usage` in one pass over the pods, awaiting `pace` after each (1,000 pods: ~5 ms of
    store queries with the 5 s window)."""
    node_last = store.last(MetricKind.NODE_CPU_USAGE)
    smooth = node_last is not None and samples > 1
    span = (samples + 1) * store.collect_interval
    pod_used: dict[str, float] = {}
    pods: list[tuple[float, list[float]]] = []
    for uid in pod_uids:
        v = store.last(MetricKind.POD_CPU_USAGE, uid)
        if v is not None:
            pod_used[uid] = v
            if smooth:
                pods.append((v, store.values(MetricKind.POD_CPU_USAGE, uid, window=span)))
        await pace()
    if node_last is None or not smooth:
        return node_last, pod_used
    return _combine(store, node_last, pods, samples, span), pod_used


@dataclass
class QuotaHysteresis:
    """The band check of the BE quota, with the memory of a move in progress (see the module docstring)."""

    percent: float = 0.0
    moving: bool = False

    def decide(self, new: int | None, target: int, current: int, capacity_milli: int) -> int | None:
        """The quota to write (`new`, already bypass- and step-limited), or None to keep `current`."""
        if new is None:
            self.moving = False
            return None
        if self.percent > 0 and current != UNSET_QUOTA and not self.moving:
            band = math.ceil(capacity_milli / 1000) * CFS_PERIOD * self.percent / 100
            if abs(new - current) < band:
                return None
        self.moving = new != target  # step-limited: keep going next round even inside the band
        return new
