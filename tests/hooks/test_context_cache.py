"""pod_extended: batch resources computed once per PodInfo (immutable), never served for another pod."""

from __future__ import annotations

from koordqos.hooks.context import pod_extended
from koordqos.model.pod import ContainerInfo, PodInfo


def _pod(uid: str, batch_cpu: int) -> PodInfo:
    containers = tuple(
        ContainerInfo(name=f"c{i}", requests={"kubernetes.io/batch-cpu": batch_cpu}) for i in range(20)
    )
    return PodInfo(uid=uid, containers=containers)


def test_batch_resources_are_computed_once_per_pod_object() -> None:
    pod = _pod("u1", 1000)
    first = pod_extended(pod)
    assert first is not None
    assert set(first.containers) == {f"c{i}" for i in range(20)}
    assert pod_extended(pod) is first  # the same object: no walk over the 20 containers again
    changed = _pod("u1", 2000)  # the pod's next version (same uid): computed afresh
    again = pod_extended(changed)
    assert again is not first
    assert again is not None
    assert again.containers["c0"].requests == {"kubernetes.io/batch-cpu": 2000}
    assert pod_extended(PodInfo(uid="u2")) is None
