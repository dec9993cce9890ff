"""Group identity whatever the order of events (issue #32 item 5a): container dirs follow their pod's bvt,
and nothing is derived from an incomplete view of the pods (the dangling-pod-dir step waits for the pod
sources to sync: the API server's list, and in local mode the NRI Synchronize)."""

from __future__ import annotations

import json
from pathlib import Path

from koordqos.events.records import RuntimeContainer, RuntimeSandbox
from koordqos.events.types import (
    NodeSLOUpdated,
    PodsReplaced,
    PodUpserted,
    RuntimeSynchronized,
    SourceSynced,
)
from koordqos.hooks.reconcile_plan import LOCAL_POD_SOURCES
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import ContainerInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState, reduce
from koordqos.testing.nodefs import SyntheticNode

from .conftest import make_node, make_reconciler, pod

BVT = "cpu.bvt_warp_ns"
SLO = NodeSLOUpdated(
    parse_nodeslo(
        {
            "resourceQOSStrategy": {
                "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
                "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
                "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
            }
        }
    )
)


def then(s: NodeState, *events: object) -> NodeState:
    for e in events:
        s = reduce(s, e)  # type: ignore[arg-type]
    return s


def bvt(node: SyntheticNode, rel: str) -> str:
    return node.read(rel, "cpu", BVT)


def lsr(annotations: dict[str, str] | None = None, qos: str = "LSR") -> object:
    return pod(
        "db",
        qos,
        KubeQoS.GUARANTEED,
        [ContainerInfo(name="postgres", container_id="containerd://pg")],
        annotations=annotations,
    )


async def test_a_pod_after_the_nodeslo_gets_its_bvt_in_its_container_dirs_too(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = lsr()
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    cdir = node.layout.container_dir_in(pdir, "containerd://pg")
    rec = make_reconciler(node)
    # the NodeSLO first: the rule changes in a pass that has no pod yet
    s = then(NodeState(), SourceSynced("pods"), SLO)
    await rec.reconcile(s, "NodeSLOUpdated")
    # then the pod: no rule change, but its container dir must get the pod's value (it stayed 0)
    await rec.reconcile(then(s, PodsReplaced((p,))), "PodsReplaced")  # type: ignore[arg-type]
    assert (bvt(node, pdir), bvt(node, cdir)) == ("2", "2")


async def test_a_pod_change_moves_its_container_dirs_with_it(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    ls = pod("web", "LS", KubeQoS.BURSTABLE, [ContainerInfo(name="nginx", container_id="containerd://ngx")])
    pdir = node.add_pod(ls)
    cdir = node.layout.container_dir_in(pdir, "containerd://ngx")
    rec = make_reconciler(node)
    s = then(NodeState(), SourceSynced("pods"), SLO, PodsReplaced((ls,)))
    await rec.reconcile(s, "start")
    assert (bvt(node, pdir), bvt(node, cdir)) == ("2", "2")
    # the LS pod asks for offline priority (koordinator.sh/cpuQOS): a pod event, the rule unchanged
    annotated = pod(
        "web",
        "LS",
        KubeQoS.BURSTABLE,
        ls.containers,
        annotations={"koordinator.sh/cpuQOS": json.dumps({"enable": True, "groupIdentity": -1})},
    )
    await rec.reconcile(then(s, PodUpserted(annotated)), "PodUpserted")
    assert (bvt(node, pdir), bvt(node, cdir)) == ("-1", "-1")


async def test_no_dangling_value_until_the_pod_list_synced(tmp_path: Path) -> None:
    """Cluster mode: a restart over a configured node; the NodeSLO arrives before the API server's pods."""
    node = make_node(tmp_path)
    live = lsr()
    ldir = node.add_pod(live)  # type: ignore[arg-type]
    lcdir = node.layout.container_dir_in(ldir, "containerd://pg")
    gone = pod("gone", None, KubeQoS.GUARANTEED, [ContainerInfo(name="c", container_id="containerd://gc")])
    gdir = node.add_pod(gone)
    gcdir = node.layout.container_dir_in(gdir, "containerd://gc")
    for rel in (ldir, lcdir, gdir, gcdir):
        node.write(rel, "cpu", BVT, 2)  # what the previous agent left: all of them LSR priority
    rec = make_reconciler(node)
    before = then(NodeState(), SLO)  # no pod listed yet
    await rec.reconcile(before, "NodeSLOUpdated")
    assert [bvt(node, rel) for rel in (ldir, lcdir, gdir, gcdir)] == ["2"] * 4
    assert not [d for d in rec.decisions.recent() if d.target.startswith(ldir)]
    # the list arrives: the live pod keeps its value, the pod dir no pod owns gets its QoS dir's (0), in the
    # first pass that knows every pod, although the rule did not change in it
    await rec.reconcile(then(before, PodsReplaced((live,)), SourceSynced("pods")), "SourceSynced")  # type: ignore[arg-type]
    assert [bvt(node, rel) for rel in (ldir, lcdir, gdir, gcdir)] == ["2", "2", "0", "0"]
    assert not [d for d in rec.decisions.recent() if d.target.startswith(ldir)]
    # done once: a later pass does not redo it
    node.write(gdir, "cpu", BVT, 2)
    await rec.reconcile(then(before, PodsReplaced((live,)), SourceSynced("pods")), "interval", full=False)  # type: ignore[arg-type]
    assert bvt(node, gdir) == "2"


async def test_local_mode_waits_for_the_nri_synchronize(tmp_path: Path) -> None:
    """Local mode: "pods" is synced at start, but the pods come with the NRI Synchronize."""
    node = make_node(tmp_path)
    live = lsr()
    ldir = node.add_pod(live)  # type: ignore[arg-type]
    node.write(ldir, "cpu", BVT, 2)
    rec = make_reconciler(node, pod_sources=LOCAL_POD_SOURCES)
    start = then(NodeState(), SourceSynced("node"), SourceSynced("pods"), SLO)
    await rec.reconcile(start, "NodeSLOUpdated")
    assert bvt(node, ldir) == "2"  # 2 -> 0 before (reason NodeSLOUpdated)
    # the runtime's pods: known through their sandbox (the local pod source has not turned them into pods yet)
    sandbox = RuntimeSandbox("sb-db", "db", "db", "ns", {"koordinator.sh/qosClass": "LSR"}, {}, f"/{ldir}")
    ctr = RuntimeContainer("pg", "sb-db", "db", "postgres", f"/{ldir}/pg", state="running")
    node.make_cgroup(f"{ldir}/pg")
    synced = then(start, RuntimeSynchronized((sandbox,), (ctr,)), SourceSynced("nri"))
    await rec.reconcile(synced, "RuntimeSynchronized")
    assert (bvt(node, ldir), bvt(node, f"{ldir}/pg")) == ("2", "2")
    written = [d.new for d in rec.decisions.recent() if d.target.startswith(ldir) and d.target.endswith(BVT)]
    assert written == ["2"]  # the container dir 0 -> 2, nothing else


async def test_without_a_pod_source_no_pod_dir_is_ever_written(tmp_path: Path) -> None:
    """Local mode with --enable-nri=false: the pods never come; a live pod's dir is left as it is."""
    node = make_node(tmp_path)
    ldir = node.add_pod(lsr())  # type: ignore[arg-type]
    node.write(ldir, "cpu", BVT, 2)
    rec = make_reconciler(node, pod_sources=LOCAL_POD_SOURCES)
    s = then(NodeState(), SourceSynced("pods"), SLO)
    for trigger in ("start", "NodeSLOUpdated", "interval"):
        await rec.reconcile(s, trigger)
    assert bvt(node, ldir) == "2"
    assert [bvt(node, d) for d in node.layout.qos_dirs()] == ["0", "2", "-1"]  # kube-QoS dirs need no pod
