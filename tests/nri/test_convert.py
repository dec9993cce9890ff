"""NRI conversion (nri/convert.py): resources both ways, the project's decisions
(docs/behaviour-runtime-hooks.md, "Project decisions"; docs/behaviour-nri.md, "Events and answers"), failure
policy and dry-run."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from koordqos.cgroups.executor import CgroupExecutor
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import FailurePolicy
from koordqos.decisions import DecisionLog
from koordqos.errors import HookError
from koordqos.hooks.core import Call, HookCore, run_call
from koordqos.hooks.resources import Resources
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.nri.calls import (
    NRICall,
    NRICreateContainer,
    NRIRunPodSandbox,
    NRISynchronize,
    NRIUpdateContainer,
)
from koordqos.nri.convert import NRIHooks, differing, envs_from_nri, resources_from_nri
from koordqos.state import NodeState
from koordqos.testing.cycles import cyclic_garbage, names
from koordqos.testing.nodefs import SyntheticNode


def make_node(tmp_path: Path) -> SyntheticNode:
    """A cgroup v1, cgroupfs synthetic node with the bvt extension (as the hook tests use)."""
    return SyntheticNode(
        tmp_path / "node", CgroupVersion.V1, CgroupDriver.CGROUPFS, extensions=("cpu.bvt_warp_ns",)
    )


ERS = json.dumps(
    {
        "containers": {
            "c": {
                "requests": {"kubernetes.io/batch-cpu": "500"},
                "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"},
            }
        }
    }
)


def be_pod(annotation: str = ERS) -> api.PodSandbox:
    pod = api.PodSandbox(
        id="sb",
        name="p",
        uid="uid-1",
        namespace="ns",
        labels={"koordinator.sh/qosClass": "BE"},
        annotations={"node.koordinator.sh/extended-resource-spec": annotation},
    )
    pod.linux.cgroup_parent = "/kubepods/besteffort/poduid-1"
    return pod


def ctr(state: int = api.CONTAINER_RUNNING) -> api.Container:
    c = api.Container(id="cid", pod_sandbox_id="sb", name="c", state=state, env=["A=1", "=x", "B="])  # type: ignore[arg-type]
    c.linux.cgroups_path = "/kubepods/besteffort/poduid-1/cid"
    return c


def nh(tmp_path: Path, dry_run: bool = False) -> NRIHooks:
    node = make_node(tmp_path)
    decisions = DecisionLog(dry_run=dry_run)
    return NRIHooks(HookCore(RuntimeHooks(), CgroupExecutor(node.layout, decisions), decisions), node.layout)


async def serve(h: NRIHooks, event: NRICall, policy: FailurePolicy = "Ignore") -> Call:
    """Serve one NRI call as the plugin does: through the hook core's run_call."""
    return await run_call(type(event).__name__, 10.0, policy, lambda call: h(event, NodeState(), call))


def test_resources_from_nri_zero_means_unset() -> None:
    res = api.LinuxResources()
    res.cpu.shares.value = 0
    res.cpu.quota.value = 5000
    res.memory.limit.value = -5
    assert resources_from_nri(res) == Resources(cfs_quota=5000, memory_limit=-1)
    assert resources_from_nri(None) is None
    assert envs_from_nri(["A=1", "=x", "B=", "C=a=b"]) == {"A": "1", "C": "a=b"}


def test_differing_only_sends_changes() -> None:
    want = Resources(cpu_shares=512, cfs_quota=-1, cpuset="", memory_limit=-1)
    assert not differing(want, Resources(cpu_shares=512)).is_origin_set()
    assert differing(want, Resources(cpu_shares=2)) == Resources(cpu_shares=512)


async def test_create_container_adjustment_and_no_update_for_itself(tmp_path: Path) -> None:
    h = nh(tmp_path)
    ev = NRICreateContainer(be_pod(), ctr(api.CONTAINER_CREATED))
    await serve(h, ev)
    r = ev.adjust.linux.resources
    assert (r.cpu.shares.value, r.cpu.quota.value, r.memory.limit.value) == (512, 50000, 1 << 30)
    assert not r.cpu.cpus  # the empty BE cpuset is left out in NRI mode
    assert ev.updates == []


async def test_update_container_uses_the_requested_resources_and_names_the_container(tmp_path: Path) -> None:
    h = nh(tmp_path)
    ls = api.PodSandbox(id="sb", name="p", uid="u2", namespace="ns", labels={"koordinator.sh/qosClass": "LS"})
    ev = NRIUpdateContainer(ls, ctr())
    ev.linux_resources.cpu.quota.value = 100000
    await serve(h, ev)
    assert ev.updates == []  # nothing set: no (empty) update
    ev = NRIUpdateContainer(be_pod(), ctr())
    await serve(h, ev)
    assert [u.container_id for u in ev.updates] == ["cid"]


async def test_synchronize_skips_stopped_and_unchanged_containers(tmp_path: Path) -> None:
    h = nh(tmp_path)
    stopped = ctr(api.CONTAINER_STOPPED)
    ev = NRISynchronize([be_pod()], [stopped])
    await serve(h, ev)
    assert ev.updates == []
    fine = ctr()
    rr = fine.linux.resources
    rr.cpu.shares.value, rr.cpu.quota.value, rr.memory.limit.value = 512, 50000, 1 << 30
    ev = NRISynchronize([be_pod()], [fine])
    await serve(h, ev)
    assert ev.updates == []


async def test_run_pod_sandbox_fail_policy_writes_nothing(tmp_path: Path) -> None:
    h = nh(tmp_path)
    pod = be_pod()
    pod_dir = h.layout.normalize_parent(pod.linux.cgroup_parent)
    quota = h.layout.file_path(pod_dir, "cpu.cfs_quota_us")
    quota.parent.mkdir(parents=True)
    quota.write_text("-1\n")
    # a malformed resource-status makes CPUSetAllocator fail: under Fail nothing is written
    pod.annotations["scheduling.koordinator.sh/resource-status"] = "bad-format"
    with pytest.raises(HookError):
        await serve(h, NRIRunPodSandbox(pod), "Fail")
    # under Ignore the BE pod's values are written before the reply
    await serve(h, NRIRunPodSandbox(be_pod()))
    assert quota.read_text().strip() == "50000"


async def test_dry_run_records_and_adjusts_nothing(tmp_path: Path) -> None:
    h = nh(tmp_path, dry_run=True)
    ev = NRICreateContainer(be_pod(), ctr(api.CONTAINER_CREATED))
    await serve(h, ev)
    assert ev.adjust.ByteSize() == 0
    last = h.core.decisions.recent()[-1]
    assert last.dry_run
    assert last.action == "nri-adjust"
    assert "quota=50000" in str(last.new)


async def test_missing_pod_linux_and_hostile_paths_are_tolerated(tmp_path: Path) -> None:
    h = nh(tmp_path)
    pod = api.PodSandbox(
        id="sb",
        name="p",
        uid="u",
        namespace="ns",
        labels={"koordinator.sh/qosClass": "BE"},
        annotations={"node.koordinator.sh/extended-resource-spec": ERS},
    )
    c = ctr()
    c.linux.cgroups_path = "/kubepods/../../etc"
    cc = h.container_context(pod, c, NodeState())
    assert (cc.request.pod_cgroup_parent, cc.request.cgroup_parent) == ("", "")
    ev = NRICreateContainer(pod, c)
    await serve(h, ev)
    assert ev.adjust.linux.resources.cpu.quota.value == 50000  # resource values still flow to the runtime


async def test_a_pod_is_converted_once_per_distinct_message_and_never_served_stale(tmp_path: Path) -> None:
    """Every container call of a pod repeats the pod: its view is kept per exact PodSandbox bytes, so the same
    pod is converted once, and any change (an annotation, the API server's pod) gives a fresh view."""
    from koordqos.events.types import PodUpserted
    from koordqos.model.pod import parse_pod
    from koordqos.state import reduce
    from tests.support.fake_objects import make_pod

    h = nh(tmp_path)
    state = NodeState()
    first = h.pod_view(be_pod(), state)
    assert h.pod_view(be_pod(), state) is first  # an equal message: the same view
    assert first.pod_dir == "kubepods/besteffort/poduid-1"
    assert first.extended is not None
    assert first.extended.containers["c"].limits["kubernetes.io/batch-cpu"] == 500

    # the same sandbox id with another annotation: a new view with the new value
    changed = be_pod(
        ERS.replace(
            '"500"}, "limits": {"kubernetes.io/batch-cpu": "500"',
            '"500"}, "limits": {"kubernetes.io/batch-cpu": "700"',
        )
    )
    view = h.pod_view(changed, state)
    assert view is not first
    assert view.extended is not None
    assert view.extended.containers["c"].limits["kubernetes.io/batch-cpu"] == 700
    ev = NRICreateContainer(changed, ctr(api.CONTAINER_CREATED))
    await run_call("c", 10.0, "Ignore", lambda call: h(ev, state, call))
    assert ev.adjust.linux.resources.cpu.quota.value == 70000

    # the API server's pod (preferred over the annotation) appears: the cached view is not used
    raw = make_pod(
        "p",
        "node",
        namespace="ns",
        qos="BE",
        uid="uid-1",
        requests={"kubernetes.io/batch-cpu": "300"},
        limits={"kubernetes.io/batch-cpu": "300"},
    )
    raw["spec"]["containers"][0]["name"] = "c"
    known = reduce(state, PodUpserted(parse_pod(raw)))
    view = h.pod_view(be_pod(), known)
    assert view is not first
    assert view.extended is not None
    assert view.extended.containers["c"].limits["kubernetes.io/batch-cpu"] == 300
    assert h.pod_view(be_pod(), known) is view


def test_a_bad_pod_is_counted_on_every_call_though_converted_once(tmp_path: Path) -> None:
    from koordqos.observability import REGISTRY

    def errors() -> float:
        return (
            REGISTRY.get_sample_value("koordqos_nri_convert_errors_total", {"kind": "extended_resource_spec"})
            or 0.0
        )

    h = nh(tmp_path)
    bad = be_pod("{not json")
    before = errors()
    views = {id(h.pod_view(bad, NodeState())) for _ in range(3)}
    assert len(views) == 1
    assert errors() == before + 3
    assert h.pod_view(bad, NodeState()).extended is None


def test_pod_views_are_bounded(tmp_path: Path) -> None:
    from koordqos.nri import convert

    h = nh(tmp_path)
    for i in range(1_000):  # distinct messages: every one a view
        pod = be_pod()
        pod.uid = f"uid-{i}"
        pod.id = f"sb-{i}"
        pod.annotations["pad"] = "p" * (i % 500)
        h.pod_view(pod, NodeState())
        assert h._pod_views.weight <= convert.POD_VIEW_BYTES
    assert 0 < len(h._pod_views) < 1_000
    kept = h._pod_views.get(pod.id)
    assert kept is not None
    assert kept[0] == pod.SerializeToString(deterministic=True)  # the newest is kept
    huge = be_pod()
    huge.id = "huge"
    huge.annotations["x"] = "y" * (convert.POD_VIEW_MAX_BYTES + 1)
    h.pod_view(huge, NodeState())
    assert huge.id not in h._pod_views


def test_the_cgroup_parent_memo_stays_within_its_byte_budget_whatever_the_parents(tmp_path: Path) -> None:
    # a runtime reporting a new, long cgroup parent with every call: the memo of checked dirs keeps a
    # budget of bytes, not a count of entries of any size (8,192 entries of 2 KiB parents were ~32 MiB)
    from koordqos.nri.convert import DIR_MEMO_BYTES

    h = nh(tmp_path)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(5_000):
            pod = be_pod()
            pod.uid = f"uid-{i}"
            pod.linux.cgroup_parent = f"/kubepods/besteffort/pod{i:06d}-" + "x" * 2_000
            cc = h.pod_context(pod, NodeState())
            assert cc.request.cgroup_parent == f"kubepods/besteffort/pod{i:06d}-" + "x" * 2_000
        del pod, cc
        h._pod_views.clear()  # bounded on their own (test_pod_views_are_bounded); measured here: the memo
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert h._dirs.weight <= DIR_MEMO_BYTES
    assert after - before < DIR_MEMO_BYTES * 1.5  # what the entries weigh, plus the dict's own table
    same = be_pod()
    assert h.pod_context(same, NodeState()).request.cgroup_parent == "kubepods/besteffort/poduid-1"
    assert same.linux.cgroup_parent in h._dirs  # a real parent is memoised
    hostile = be_pod()
    hostile.linux.cgroup_parent = "/kubepods/" + "y" * 8_000
    assert h.pod_context(hostile, NodeState()).request.cgroup_parent == "kubepods/" + "y" * 8_000
    assert hostile.linux.cgroup_parent not in h._dirs  # too long to be worth a share of the budget


def test_a_bad_pod_view_leaves_no_reference_cycle_when_it_goes(tmp_path: Path) -> None:
    # a view kept its problems as exceptions: their tracebacks held the converting frames and, through
    # them, the NodeState and the view itself; the agent's GC policy freezes such cycles for good (the fuzz
    # run's RSS growth: ~2,500 objects kept per 100,000 hostile requests)
    h = nh(tmp_path)
    bad = be_pod("[" * 5_000)  # nesting too deep to decode
    bad.linux.cgroup_parent = "/kubepods/../../etc"

    def convert_and_forget() -> None:
        view = h.pod_view(bad, NodeState())
        assert {kind for kind, _what, _error in view.problems} == {"cgroup_parent", "extended_resource_spec"}
        h._pod_views.clear()

    garbage = cyclic_garbage(convert_and_forget)
    assert garbage == [], names(garbage)


def test_a_pod_view_is_found_whatever_order_its_maps_came_in(tmp_path: Path) -> None:
    """A Go runtime marshals map fields in random order: the same pod with its labels and annotations in
    another order is the same view; a change of a value is not."""
    h = nh(tmp_path)
    state = NodeState()
    keys = [f"k{i}" for i in range(8)]
    views = set()
    for order in (keys, keys[::-1], keys[3:] + keys[:3]):
        pod = be_pod()
        for k in order:
            pod.labels[k] = "v"
            pod.annotations[k] = "w"
        views.add(id(h.pod_view(api.PodSandbox.FromString(pod.SerializeToString()), state)))
    assert len(views) == 1
    pod.labels["k0"] = "changed"
    assert id(h.pod_view(pod, state)) not in views
    assert h.pod_view(pod, state).labels["k0"] == "changed"


def test_resources_from_nri_reads_without_setting_anything() -> None:
    """Read without HasField checks: an unset message reads as its defaults, and reading sets nothing (the
    request protobufs are read-only)."""
    res = api.LinuxResources()
    assert resources_from_nri(res) == Resources()
    assert not res.HasField("cpu")
    assert not res.HasField("memory")
    assert res.ByteSize() == 0
    res.cpu.cpus = "0-1"
    res.memory.limit.value = 1 << 30
    assert resources_from_nri(res) == Resources(cpuset="0-1", memory_limit=1 << 30)
    assert not res.cpu.HasField("shares")
