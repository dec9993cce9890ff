"""The Kubernetes Event of a CPU-suppress change: on the Node, when the besteffort cap moved.

Pure: `suppress_event` looks at one round's write results and returns the Event's reason and message (None
when the cap did not change). The strategy posts it through the rate-limited recorder (one per minute; the
ones held back are summed into the next), off the strategy's round.
"""

from __future__ import annotations

from collections.abc import Sequence

from koordqos.cgroups.executor import Outcome, WriteResult

EVENT_REASON = "BECPUSuppressed"
EVENT_REASON_RECOVERED = "BECPURecovered"
_LANDED = (Outcome.WRITTEN,)  # dry-run changes nothing: no Event either


def node_reference(name: str, uid: str = "") -> dict[str, str]:
    """The Event's involvedObject: the Node (cluster-scoped, so its Events live in "default")."""
    ref = {"apiVersion": "v1", "kind": "Node", "name": name}
    if uid:
        ref["uid"] = uid
    return ref


def suppress_event(results: Sequence[WriteResult], be_dir: str) -> tuple[str, str] | None:
    """(reason, message) for the besteffort dir's quota or cpuset change in `results`, or None."""
    for r in results:
        w = r.write
        if w.parent != be_dir or r.outcome not in _LANDED:
            continue
        if w.resource == "cpu.cfs_quota_us":
            new = str(w.value)
            if new == "-1":
                return EVENT_REASON_RECOVERED, "best-effort CPU quota restored to unlimited"
            cores = int(new) / 100_000
            return EVENT_REASON, f"best-effort CPU quota {r.old or '?'} → {new} µs ({cores:.2f} cores)"
        if w.resource == "cpuset.cpus" and r.old != r.new:
            return EVENT_REASON, f"best-effort cpuset {r.old or '?'} → {w.value}"
    return None
