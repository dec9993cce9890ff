"""BE pods whose first CPU sample has not come yet (Project decision, docs/cpu-suppress-stability.md).

A pod's CPU usage is a rate, so the collector needs two readings of its counter: a pod's first sample comes
one collect round after the node's usage already holds its CPU. For that round the split puts a running BE
pod's CPU in "system usage", and `suppress = capacity × threshold − LS − system` drops by it: at start-up
(pods listed after the collector's first node reading) and whenever a BE pod starts, CPU suppress cut BE to
the floor and climbed back 10 % of the node per round (issue #32, item 5c).

`FirstSampleWait` names the BE pods with a running container and no CPU sample yet, for at most `rounds`
collect intervals from the round it first saw them so (a pod that cannot be measured does not hold CPU
suppress for longer; its CPU is then system usage, as before). CPU suppress plans nothing while any is
named. `rounds = 0` gives koordlet's planner: such a pod's CPU counts as system usage until it is measured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from koordqos.model.pod import PodInfo

DEFAULT_WAIT_ROUNDS = 3


def running_containers(pod: PodInfo) -> tuple[str, ...]:
    """The ids of the pod's running containers (what can use CPU)."""
    return tuple(c.container_id for c in pod.containers if c.state == "running" and c.container_id)


@dataclass
class FirstSampleWait:
    """Which running BE pods are still within their wait for a first CPU sample."""

    rounds: int = DEFAULT_WAIT_ROUNDS
    # uid → (its running containers, when first seen running without a sample): a container (re)start
    # starts the wait again; a pod measured, stopped or gone is dropped
    since: dict[str, tuple[tuple[str, ...], float]] = field(default_factory=dict)

    def waiting(
        self,
        pods: Mapping[str, PodInfo],
        is_be: Callable[[PodInfo], bool],
        pod_used: Mapping[str, float],
        now: float,
        collect_interval: float,
    ) -> tuple[str, ...]:
        """The keys (`ns/name`) of the BE pods waited for this round, sorted; () when none."""
        grace = self.rounds * collect_interval
        if grace <= 0:
            self.since.clear()
            return ()
        since: dict[str, tuple[tuple[str, ...], float]] = {}
        out: list[str] = []
        for uid, pod in pods.items():
            if uid in pod_used or pod.terminated or not is_be(pod):
                continue
            running = running_containers(pod)
            if not running:
                continue  # nothing of it runs: its CPU is ~0 wherever it is counted
            seen = self.since.get(uid)
            first = seen[1] if seen is not None and seen[0] == running else now
            since[uid] = (running, first)
            if now - first < grace:
                out.append(pod.key)
        self.since = since
        return tuple(sorted(out))
