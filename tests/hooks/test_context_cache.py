"""pod_extended: batch resources computed once per PodInfo (immutable), never served for another pod."""

from __future__ import annotations

import tracemalloc

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


def test_the_cache_holds_one_pod_object_per_uid_not_every_version() -> None:
    # a pod source that republishes a pod makes a new PodInfo per change: the cache must not keep them all
    from koordqos.hooks.context import _EXTENDED_OF_POD

    versions = [_pod("u-many", 1000 + i) for i in range(50)]
    for pod in versions:
        pod_extended(pod)
    held = [entry[0]() for uid, entry in _EXTENDED_OF_POD.items() if uid == "u-many"]
    assert held == [versions[-1]]


def test_a_pod_that_is_gone_leaves_nothing_in_the_cache() -> None:
    # pods a hostile runtime announces and drops, each with 16 KiB of annotations: once nothing else holds
    # a pod (NodeState dropped it), the cache holds neither the pod nor its batch resources
    from koordqos.hooks.context import _EXTENDED_OF_POD

    spec = '{"containers": {"c": {"requests": {"kubernetes.io/batch-cpu": "1000"}}}}'

    def pod(i: int) -> PodInfo:
        annotations = {"node.koordinator.sh/extended-resource-spec": spec, "junk": f"{i}" + "x" * 16_384}
        return PodInfo(uid=f"gone-{i}", annotations=annotations)

    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(500):
            ext = pod_extended(pod(i))  # the pod object is dropped right after, as NodeState drops it
            assert ext is not None
            assert ext.containers["c"].requests == {"kubernetes.io/batch-cpu": 1000}
        del ext
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not [uid for uid in _EXTENDED_OF_POD if uid.startswith("gone-")]
    assert after - before < 64 * 1024  # 500 pods of 16 KiB held: 8 MiB
    kept = pod(-1)
    ext = pod_extended(kept)
    assert pod_extended(kept) is ext  # a pod still alive is still cached
