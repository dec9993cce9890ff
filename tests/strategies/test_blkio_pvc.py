"""blkio for a pod volume that is a PersistentVolumeClaim (docs/reconcile.md, "Blkio"): the PVC watch (a
reflector on the fake API server) binds the claim to its volume, and the BlkioReconcile round throttles the
pod's dir for the disk under that volume's kubelet mount. Before the watch such pods were skipped ("claim is
not bound to a known volume")."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from koordqos.bus import EventBus
from koordqos.config import AgentConfig
from koordqos.kube import KubeConnection, cluster_sources
from koordqos.kube.eventrecorder import EventRecorder
from koordqos.kube.pvc import VolumeClaimSource, claim_binding
from koordqos.kube.watch import WatchEvent
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import parse_pod
from koordqos.state import NodeState
from koordqos.strategies.blkio import BlkioReconcileStrategy, pod_volume_mount
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until
from koordqos.testing.strategyenv import strategy_env
from tests.support.fake_apiserver import FakeAPIServer

UID = "0000dddd-0000-4000-8000-000000000001"


def claim(name: str, volume: str | None, ns: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"]}
    if volume:
        spec["volumeName"] = volume
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def be_pod() -> Any:
    annotation = {
        "blocks": [{"name": "html", "type": "podvolume", "ioCfg": {"readIOPS": 1024, "writeIOPS": 512}}]
    }
    return parse_pod(
        {
            "metadata": {
                "uid": UID,
                "name": "web",
                "namespace": "default",
                "labels": {"koordinator.sh/qosClass": "BE"},
                "annotations": {"koordinator.sh/blkioQOS": json.dumps(annotation)},
            },
            "spec": {
                "containers": [{"name": "c"}],
                "volumes": [{"name": "html", "persistentVolumeClaim": {"claimName": "html-claim"}}],
            },
            "status": {"phase": "Running", "qosClass": "BestEffort"},
        }
    )


def test_claim_binding() -> None:
    assert claim_binding(claim("a", "pv-a")) == ("default/a", "pv-a")
    assert claim_binding(claim("a", None)) is None  # not bound yet
    assert claim_binding({"metadata": []}) is None


async def test_the_source_follows_binds_and_deletes() -> None:
    bus = EventBus()
    src = VolumeClaimSource(bus)
    await src.on_list([claim("a", "pv-a"), claim("b", None)])
    assert dict(bus.state.volume_claims) == {"default/a": "pv-a"}
    assert "pvcs" in bus.state.synced
    await src.on_event(WatchEvent("MODIFIED", claim("b", "pv-b")))
    await src.on_event(WatchEvent("DELETED", claim("a", "pv-a")))
    assert dict(bus.state.volume_claims) == {"default/b": "pv-b"}
    generation = bus.state.generation
    await src.on_event(WatchEvent("MODIFIED", claim("b", "pv-b")))  # nothing new: no event
    assert bus.state.generation == generation


async def test_a_pvc_volume_gets_its_throttles(tmp_path: Path) -> None:
    server = FakeAPIServer(token=None)
    await server.start()
    node = SyntheticNode(tmp_path / "node")
    pod = be_pod()
    pod_dir = node.add_pod(pod)
    node.add_block_device("vdb", "253:16")
    node.add_mount("/dev/vdb", pod_volume_mount("/var/lib/kubelet", UID, "pv-html"))
    config = AgentConfig(
        feature_gates={"BlkIOReconcile": True},
        kube={"node_name": "n1"},
        paths={"cgroup_root": node.cgroup_root, "proc_root": node.proc_root, "sys_root": node.sys_root},
    )
    bus = EventBus()
    conn = KubeConnection(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    reflectors, _ = cluster_sources(bus, conn, EventRecorder(conn.get, "n1"), config)
    [pvcs] = [r for r in reflectors if r.resource == "pvcs"]
    assert not [
        r
        for r in cluster_sources(bus, conn, EventRecorder(conn.get, "n1"), AgentConfig())[0]
        if r.resource == "pvcs"
    ]
    server.upsert("persistentvolumeclaims", claim("html-claim", "pv-html"))
    task = asyncio.create_task(pvcs.run())
    try:
        await wait_until(
            lambda: "default/html-claim" in bus.state.volume_claims, message="the claim's binding"
        )
        slo = parse_nodeslo(
            {"spec": {"resourceQOSStrategy": {"beClass": {"blkioQOS": {"enable": True, "blocks": []}}}}}
        )
        state = NodeState(pods={pod.uid: pod}, node_slo=slo, volume_claims=bus.state.volume_claims)
        strategy = BlkioReconcileStrategy()
        env = strategy_env(node.layout, config=config)
        await strategy.run_once(state, env)
        assert strategy.last_plan is not None
        assert strategy.last_plan.problems == {}
        assert node.read(pod_dir, "blkio", "blkio.throttle.read_iops_device").strip() == "253:16 1024"
        assert node.read(pod_dir, "blkio", "blkio.throttle.write_iops_device").strip() == "253:16 512"
        # the claim goes away: the pod's volume no longer resolves, reported, files left as they were
        server.delete("persistentvolumeclaims", "html-claim")
        await wait_until(lambda: not bus.state.volume_claims, message="the claim forgotten")
        await strategy.run_once(
            NodeState(pods={pod.uid: pod}, node_slo=slo, volume_claims=bus.state.volume_claims), env
        )
        assert strategy.last_plan is not None
        assert "not bound" in next(iter(strategy.last_plan.problems.values()))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.close()
        await server.stop()
