"""Local-mode pods carry their runtime containers: ids, states, resources, QoS, coalesced republishing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.events.types import (
    Event,
    NRIConnectionChanged,
    PodDeleted,
    PodsReplaced,
    PodUpserted,
    RuntimeContainer,
    RuntimeContainerRemoved,
    RuntimeContainerUpserted,
    RuntimeSandbox,
    RuntimeSandboxRemoved,
    RuntimeSandboxUpserted,
    RuntimeSynchronized,
)
from koordqos.localsources import (
    CGROUP_MISMATCH,
    LocalSources,
    container_resources,
    pod_from_sandbox,
    runtime_of_container,
)
from koordqos.model.qos import KubeQoS
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.runtime_objects import runtime_container
from koordqos.testing.poll import wait_until

UID = "0a1b2c3d-0000-4000-8000-000000000001"
GI = 1 << 30


def sandbox(
    qos: str = "besteffort", uid: str = UID, sid: str = "sb1", parent: str | None = None
) -> RuntimeSandbox:
    if parent is None:
        parent = f"/kubepods/{qos}/pod{uid}" if qos != "guaranteed" else f"/kubepods/pod{uid}"
    return RuntimeSandbox(id=sid, uid=uid, name="p", namespace="ns", cgroup_parent=parent)


def ctr(
    cid: str, name: str = "main", state: str = "running", sid: str = "sb1", **kw: Any
) -> RuntimeContainer:
    path = kw.pop("cgroups_path", f"/kubepods/besteffort/pod{UID}/{cid}")
    return RuntimeContainer(
        id=cid, sandbox_id=sid, pod_uid=UID, name=name, cgroups_path=path, state=state, **kw
    )


def test_runtime_container_carries_nri_linux_resources() -> None:
    c = api.Container(id="c1", pod_sandbox_id="sb1", name="main", state=api.CONTAINER_RUNNING)
    res = c.linux.resources
    res.cpu.shares.value, res.cpu.quota.value, res.cpu.period.value = 512, 150000, 100000
    res.memory.limit.value = GI
    rc = runtime_container(c, UID)
    assert (rc.cpu_shares, rc.cpu_quota, rc.cpu_period, rc.memory_limit) == (512, 150000, 100000, GI)
    assert rc.state == "running"
    bare = runtime_container(api.Container(id="c2", pod_sandbox_id="sb1", name="x"), UID)
    assert (bare.cpu_shares, bare.cpu_quota, bare.cpu_period, bare.memory_limit) == (0, 0, 0, 0)


def test_resources_follow_kubelet_conversions_and_kube_qos() -> None:
    c = ctr("c1", cpu_shares=512, cpu_quota=150000, cpu_period=100000, memory_limit=GI)
    assert container_resources(c, KubeQoS.BURSTABLE) == ({"cpu": 500}, {"cpu": 1500, "memory": GI})
    assert container_resources(c, KubeQoS.GUARANTEED) == (
        {"cpu": 1500, "memory": GI},
        {"cpu": 1500, "memory": GI},
    )
    assert container_resources(c, KubeQoS.BESTEFFORT) == ({}, {})
    # kubelet: 100m → 102 shares; shares 2 means no request; quota −1 / limit 0 mean no limit
    assert container_resources(ctr("c", cpu_shares=102), KubeQoS.BURSTABLE) == ({"cpu": 100}, {})
    unset = ctr("c", cpu_shares=2, cpu_quota=-1, cpu_period=100000, memory_limit=0)
    assert container_resources(unset, KubeQoS.BURSTABLE) == ({}, {})


def test_runtime_prefix_from_scope_path_or_runtime_name() -> None:
    systemd = "kubepods-besteffort-podx.slice:crio:abc"
    assert runtime_of_container(ctr("abc", cgroups_path=systemd)) == "cri-o"
    assert runtime_of_container(ctr("abc", cgroups_path="/kubepods/besteffort/podx/crio-abc")) == "cri-o"
    containerd = "kubepods-podx.slice:cri-containerd:abc"
    assert runtime_of_container(ctr("abc", cgroups_path=containerd), "cri-o") == "containerd"
    assert runtime_of_container(ctr("abc"), "CRI-O") == "cri-o"
    assert runtime_of_container(ctr("abc"), "docker") == "docker"
    assert runtime_of_container(ctr("abc"), "mock-containerd") == "containerd"
    assert runtime_of_container(ctr("abc"), "") == "containerd"


def test_pod_from_sandbox_with_containers() -> None:
    containers = [
        ctr("old1", "main", "stopped"),  # a restarted container: the live instance is the status
        ctr("new1", "main", "running"),
        ctr("side", "sidecar", "created"),
        ctr("done", "job", "stopped"),
    ]
    pod = pod_from_sandbox(sandbox(), "node", containers, "containerd")
    assert pod.kube_qos is KubeQoS.BESTEFFORT
    assert [(c.name, c.container_id, c.state) for c in pod.containers] == [
        ("job", "containerd://done", "terminated"),
        ("main", "containerd://new1", "running"),
        ("sidecar", "containerd://side", "waiting"),
    ]
    assert pod.source == "nri"


def test_kube_qos_from_container_path_when_sandbox_has_no_parent() -> None:
    c = ctr("c1", cgroups_path=f"/kubepods/burstable/pod{UID}/c1")
    assert pod_from_sandbox(sandbox(parent=""), "n", [c]).kube_qos is KubeQoS.BURSTABLE
    assert pod_from_sandbox(sandbox(parent=""), "n").kube_qos is KubeQoS.GUARANTEED


def test_derived_dirs_are_the_runtime_dirs_for_both_drivers(tmp_path: Path) -> None:
    uid_ = UID.replace("-", "_")
    cases = {
        CgroupDriver.CGROUPFS: (f"/kubepods/besteffort/pod{UID}", f"/kubepods/besteffort/pod{UID}/c1"),
        CgroupDriver.SYSTEMD: (
            f"kubepods-besteffort-pod{uid_}.slice",
            f"kubepods-besteffort-pod{uid_}.slice:cri-containerd:c1",
        ),
    }
    for driver, (parent, path) in cases.items():
        layout = CgroupLayout(tmp_path, CgroupVersion.V2, driver)
        pod = pod_from_sandbox(sandbox(parent=parent), "n", [ctr("c1", cgroups_path=path)])
        assert layout.pod_dir(pod) == layout.normalize_parent(parent)
        assert layout.container_dir(pod, pod.containers[0].container_id) == layout.normalize_parent(path)


class Recorder:
    def __init__(self, bus: EventBus) -> None:
        self.events: list[Event] = []
        bus.subscribe(
            "test-recorder", lambda e, s: self.events.append(e), PodUpserted, PodDeleted, PodsReplaced
        )

    def upserts(self) -> list[PodUpserted]:
        return [e for e in self.events if isinstance(e, PodUpserted)]


def local_sources(bus: EventBus, layout: CgroupLayout | None = None) -> LocalSources:
    return LocalSources(bus, build_config({"kube": {"node_name": "n"}}), layout)


async def test_container_changes_coalesced_into_one_republish(bus: EventBus) -> None:
    rec = Recorder(bus)
    local = local_sources(bus)  # run() not started: flushes are driven by the test
    await bus.publish(NRIConnectionChanged(True, "cri-o"))
    await bus.publish(RuntimeSandboxUpserted(sandbox()))
    for cid, name in (("c1", "a"), ("c2", "b")):
        for state in ("created", "created", "running"):  # create, start, post-start
            await bus.publish(RuntimeContainerUpserted(ctr(cid, name, state)))
    await bus.drained()
    assert len(rec.upserts()) == 1
    assert rec.upserts()[0].pod.containers == ()
    assert await local.flush() == 1
    await bus.drained()
    pod = bus.state.pods[UID]
    assert [(c.container_id, c.state) for c in pod.containers] == [
        ("cri-o://c1", "running"),
        ("cri-o://c2", "running"),
    ]
    assert len(rec.upserts()) == 2
    # the same container state again changes nothing: no republish
    await bus.publish(RuntimeContainerUpserted(ctr("c1", "a", "running")))
    await bus.drained()
    assert await local.flush() == 0
    await bus.publish(RuntimeContainerRemoved("c2"))
    await bus.drained()
    assert await local.flush() == 1
    await bus.drained()
    assert [c.name for c in bus.state.pods[UID].containers] == ["a"]
    # a container event of a pod removed before the flush: the pod is gone, nothing republished
    await bus.publish(RuntimeContainerUpserted(ctr("c3", "c", "created")))
    await bus.publish(RuntimeSandboxRemoved("sb1"))
    await bus.drained()
    assert await local.flush() == 0
    assert UID not in bus.state.pods
    assert local.republished == 2


async def test_flush_loop_republishes_without_manual_flush(bus: EventBus) -> None:
    local = local_sources(bus)
    local.coalesce_seconds = 0.01
    await bus.publish(RuntimeSandboxUpserted(sandbox()))
    task = asyncio.create_task(local._flush_loop())
    try:
        await bus.publish(RuntimeContainerUpserted(ctr("c1")))
        await wait_until(
            lambda: UID in bus.state.pods and len(bus.state.pods[UID].containers) == 1,
            message="container on the pod",
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_synchronize_replaces_pods_with_their_containers(bus: EventBus) -> None:
    rec = Recorder(bus)
    local = local_sources(bus)
    other = "0a1b2c3d-0000-4000-8000-000000000002"
    sbs = (sandbox(), sandbox("guaranteed", uid=other, sid="sb2"))
    g = dict(cpu_quota=200000, cpu_period=100000, memory_limit=2 * GI)
    ctrs = (
        ctr("c1"),
        ctr("c2", sid="sb2", cgroups_path=f"/kubepods/pod{other}/c2", **g),
    )
    await bus.publish(RuntimeSynchronized(sbs, ctrs))
    await bus.drained()
    replaced = [e for e in rec.events if isinstance(e, PodsReplaced)]
    assert len(replaced) == 1
    assert not rec.upserts()
    pods = {p.uid: p for p in replaced[0].pods}
    assert [c.container_id for c in pods[UID].containers] == ["containerd://c1"]
    assert pods[other].kube_qos is KubeQoS.GUARANTEED
    assert pods[other].containers[0].requests == {"cpu": 2000, "memory": 2 * GI}
    # a later removal of c1 is known to belong to sb1 through the synchronize
    await bus.publish(RuntimeContainerRemoved("c1"))
    await bus.drained()
    assert await local.flush() == 1
    await bus.drained()
    assert bus.state.pods[UID].containers == ()


async def test_runtime_cgroup_elsewhere_is_logged_once_and_counted(bus: EventBus, tmp_path: Path) -> None:
    local = local_sources(bus, CgroupLayout(tmp_path))
    before_pod = CGROUP_MISMATCH.labels("pod")._value.get()
    before_ctr = CGROUP_MISMATCH.labels("container")._value.get()
    # the runtime's parent names another uid than the sandbox's; the container lives under that parent
    stray = sandbox(parent="/kubepods/besteffort/podsomething-else")
    await bus.publish(RuntimeSandboxUpserted(stray))
    await bus.publish(
        RuntimeContainerUpserted(ctr("c1", cgroups_path="/kubepods/besteffort/podsomething-else/c1"))
    )
    await bus.drained()
    await local.flush()
    assert CGROUP_MISMATCH.labels("pod")._value.get() == before_pod + 2  # counted per rebuild
    assert CGROUP_MISMATCH.labels("container")._value.get() == before_ctr + 1
    assert "sb1" in local._warned  # logged once per sandbox / container
    assert "c1" in local._warned
    assert len(local._warned) == 2
    # a hostile runtime path is refused, not followed
    await bus.publish(RuntimeSandboxUpserted(sandbox(parent="/kubepods/../../etc")))
    await bus.drained()
    assert CGROUP_MISMATCH.labels("pod")._value.get() == before_pod + 3


async def test_a_republish_rebuilds_only_the_container_that_changed(bus: EventBus) -> None:
    local = local_sources(bus)
    await bus.publish(RuntimeSandboxUpserted(sandbox()))
    for i in range(40):
        await bus.publish(RuntimeContainerUpserted(ctr(f"c{i:02d}", f"n{i:02d}")))
    await bus.drained()
    assert await local.flush() == 1
    await bus.drained()
    before = bus.state.pods[UID].containers
    assert len(before) == 40
    await bus.publish(RuntimeContainerUpserted(ctr("c07", "n07", "stopped")))
    await bus.drained()
    assert await local.flush() == 1
    await bus.drained()
    after = bus.state.pods[UID].containers
    assert [c.state for c in after if c.name == "n07"] == ["terminated"]
    # every other ContainerInfo is the very object built before: only c07 was converted again
    assert [a is b for a, b in zip(before, after, strict=True)].count(False) == 1
    assert [c.id for c in local._built] == ["c07"]


async def test_a_removed_sandbox_forgets_its_containers_only(bus: EventBus) -> None:
    local = local_sources(bus)
    await bus.publish(RuntimeSandboxUpserted(sandbox()))
    await bus.publish(RuntimeSandboxUpserted(sandbox(uid="u2", sid="sb2")))
    await bus.publish(RuntimeContainerUpserted(ctr("c1")))
    await bus.publish(RuntimeContainerUpserted(ctr("c2", sid="sb2")))
    await bus.drained()
    await local.flush()
    await bus.publish(RuntimeSandboxRemoved("sb1"))
    await bus.drained()
    assert local._ctr_sandbox == {"c2": "sb2"}
    assert local._sandbox_ctrs == {"sb2": {"c2"}}
    assert set(local._infos) == {"c2"}
    # a removal of a container of the removed sandbox marks nothing
    await bus.publish(RuntimeContainerRemoved("c1"))
    await bus.drained()
    assert await local.flush() == 0
