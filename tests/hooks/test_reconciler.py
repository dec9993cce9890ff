"""The reconciler on a synthetic node: spec callback cases (R4, C1–C4, S1, N10–N11, O10) and convergence."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from koordqos.cgroups.resources import CgroupVersion
from koordqos.events.types import NodeSLOUpdated, NodeUpdated, PodsReplaced, SourceSynced
from koordqos.hooks.reconciler import HookReconciler
from koordqos.model.keys import BATCH_CPU, BATCH_MEMORY
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import ContainerInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState, reduce
from koordqos.testing.cookies import FakeCookieKernel
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.poll import wait_until

from .conftest import GI, make_node, make_reconciler, pod


def state(*events: object) -> NodeState:
    s = NodeState()
    for e in events:
        s = reduce(s, e)  # type: ignore[arg-type]
    return s


def be_pod(uid: str = "be1", cpu: int = 500) -> object:
    c = ContainerInfo(
        name="c0",
        container_id=f"containerd://{uid}c0",
        requests={BATCH_CPU: cpu, BATCH_MEMORY: 2 * GI},
        limits={BATCH_CPU: cpu, BATCH_MEMORY: 2 * GI},
    )
    return pod(uid, "BE", KubeQoS.BESTEFFORT, [c])


GI_SLO = {
    "resourceQOSStrategy": {
        "lsrClass": {"cpuQOS": {"enable": False, "groupIdentity": 2}},
        "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
        "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
    }
}
CFS_SUPPRESS_SLO = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}


def cpu(node: SyntheticNode, rel: str, name: str) -> str:
    return node.read(rel, "cpu", name)


async def test_r4_nodeslo_toggles_be_cfs_quota(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = be_pod()
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    cdir = node.layout.container_dir_in(pdir, "containerd://be1c0")
    rec = make_reconciler(node)
    await rec.reconcile(state(PodsReplaced((p,)), NodeSLOUpdated(parse_nodeslo({}))))  # type: ignore[arg-type]
    assert (cpu(node, pdir, "cpu.cfs_quota_us"), cpu(node, cdir, "cpu.cfs_quota_us")) == ("50000", "50000")
    assert (cpu(node, pdir, "cpu.shares"), node.read(pdir, "memory", "memory.limit_in_bytes")) == (
        "512",
        str(2 * GI),
    )
    await rec.reconcile(state(PodsReplaced((p,)), NodeSLOUpdated(parse_nodeslo(CFS_SUPPRESS_SLO))))  # type: ignore[arg-type]
    assert (cpu(node, pdir, "cpu.cfs_quota_us"), cpu(node, cdir, "cpu.cfs_quota_us")) == ("-1", "-1")


async def test_c1_group_identity_rule_writes_dirs_pods_and_containers(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    pods = [
        pod("lsr-pod", "LSR", KubeQoS.GUARANTEED),
        pod("ls-pod1", "LS", KubeQoS.GUARANTEED),
        pod("ls-pod2", "LS", KubeQoS.BURSTABLE, [ContainerInfo(name="c", container_id="containerd://ls2c")]),
        pod("be-pod", "BE", KubeQoS.BESTEFFORT),
        pod("guaranteed-pod", None, KubeQoS.GUARANTEED),
        pod("burstable-pod", None, KubeQoS.BURSTABLE),
        pod("besteffort-pod", None, KubeQoS.BESTEFFORT),
    ]
    dirs = [node.add_pod(p) for p in pods]
    rec = make_reconciler(node)
    await rec.reconcile(state(PodsReplaced(tuple(pods)), NodeSLOUpdated(parse_nodeslo(GI_SLO))))
    assert [cpu(node, d, "cpu.bvt_warp_ns") for d in node.layout.qos_dirs()] == ["0", "2", "-1"]
    assert [cpu(node, d, "cpu.bvt_warp_ns") for d in dirs] == ["0", "2", "2", "-1", "2", "2", "-1"]
    assert cpu(node, node.layout.container_dir_in(dirs[2], "containerd://ls2c"), "cpu.bvt_warp_ns") == "2"


async def test_c2_c3_disabled_rule_resets_dangling_pod_and_container_dirs(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    gone = pod(
        "besteffort-pod",
        None,
        KubeQoS.BESTEFFORT,
        [ContainerInfo(name="c", container_id="containerd://xxxxxx")],
    )
    gdir = node.add_pod(gone)
    cdir = node.layout.container_dir_in(gdir, "containerd://xxxxxx")
    rec = make_reconciler(node)
    await rec.reconcile(state(PodsReplaced((gone,)), NodeSLOUpdated(parse_nodeslo(GI_SLO))))
    assert cpu(node, gdir, "cpu.bvt_warp_ns") == "-1"
    node.write(cdir, "cpu", "cpu.bvt_warp_ns", -1)
    # the pod is no longer listed (the pod list synced: every pod known), and the rule is now disabled: every
    # dir goes back to 0
    await rec.reconcile(state(PodsReplaced(()), SourceSynced("pods"), NodeSLOUpdated(parse_nodeslo({}))))
    assert cpu(node, gdir, "cpu.bvt_warp_ns") == "0"
    assert cpu(node, cdir, "cpu.bvt_warp_ns") == "0"
    assert [cpu(node, d, "cpu.bvt_warp_ns") for d in node.layout.qos_dirs()] == ["0", "0", "0"]


async def test_c4_sysctl_unreadable_writes_nothing(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    sysctl = node.proc_root / "sys/kernel/sched_group_identity_enabled"
    sysctl.mkdir(parents=True)  # exists but cannot be read as a file
    p = pod("ls", "LS", KubeQoS.BURSTABLE)
    pdir = node.add_pod(p)
    rec = make_reconciler(node)
    await rec.reconcile(state(PodsReplaced((p,)), NodeSLOUpdated(parse_nodeslo(GI_SLO))))
    assert cpu(node, pdir, "cpu.bvt_warp_ns") == "0"
    assert [cpu(node, d, "cpu.bvt_warp_ns") for d in node.layout.qos_dirs()] == ["0", "0", "0"]


async def test_s1_s19_pinned_pod_gets_cpuset_and_unset_quota(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    c = ContainerInfo(
        name="c", container_id="containerd://lsrc", limits={"cpu": 2000}, requests={"cpu": 2000}
    )
    p = pod(
        "lsr",
        "LSR",
        KubeQoS.GUARANTEED,
        [c],
        annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"2-3"}'},
    )
    pdir = node.add_pod(p)
    cdir = node.layout.container_dir_in(pdir, "containerd://lsrc")
    node.write(pdir, "cpu", "cpu.cfs_quota_us", 200000)
    node.write(cdir, "cpu", "cpu.cfs_quota_us", 200000)
    rec = make_reconciler(node)
    await rec.reconcile(state(PodsReplaced((p,))))
    assert node.read(cdir, "cpuset", "cpuset.cpus") == "2-3"
    assert (cpu(node, pdir, "cpu.cfs_quota_us"), cpu(node, cdir, "cpu.cfs_quota_us")) == ("-1", "-1")


async def test_n10_n11_cpu_normalization_callback(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    c = ContainerInfo(name="c", container_id="containerd://lsc", limits={"cpu": 1000}, requests={"cpu": 1000})
    p = pod("ls", "LS", KubeQoS.BURSTABLE, [c])
    pdir = node.add_pod(p)
    cdir = node.layout.container_dir_in(pdir, "containerd://lsc")
    rec = make_reconciler(node, {"CPUNormalization": True})
    key = "node.koordinator.sh/cpu-normalization-ratio"
    await rec.reconcile(state(PodsReplaced((p,)), NodeUpdated(NodeInfo(name="n", annotations={key: "1.2"}))))
    assert (cpu(node, pdir, "cpu.cfs_quota_us"), cpu(node, cdir, "cpu.cfs_quota_us")) == ("83334", "83334")
    assert cpu(node, cdir, "cpu.shares") == "1024"
    mem = node.read(pdir, "memory", "memory.limit_in_bytes")
    await rec.reconcile(state(PodsReplaced((p,)), NodeUpdated(NodeInfo(name="n", annotations={key: "1.0"}))))
    assert (cpu(node, pdir, "cpu.cfs_quota_us"), cpu(node, cdir, "cpu.cfs_quota_us")) == ("100000", "100000")
    assert node.read(pdir, "memory", "memory.limit_in_bytes") == mem


async def test_o10_oom_score_adj_for_init_and_app_containers(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    init = ContainerInfo(name="init-c", container_id="containerd://initc")
    app = ContainerInfo(name="c1", container_id="containerd://appc")
    p = pod("o", "LS", KubeQoS.BURSTABLE, [app], {"koordinator.sh/oom-score-adj": "-500"}, "Pending", [init])
    pdir = node.add_pod(p)
    for cid, pid in (("initc", 21), ("appc", 22)):
        cdir = node.layout.container_dir_in(pdir, f"containerd://{cid}")
        node.write(cdir, "cpu", "cgroup.procs", pid)
        (node.proc_root / str(pid)).mkdir(parents=True)
        (node.proc_root / str(pid) / "oom_score_adj").write_text("0\n")
    rec = make_reconciler(node, {"OOMScoreAdj": True})
    await rec.reconcile(state(PodsReplaced((p,))))
    assert [(node.proc_root / f"{pid}/oom_score_adj").read_text().strip() for pid in (21, 22)] == [
        "-500",
        "-500",
    ]


async def test_value_changed_behind_the_agents_back_is_restored(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = be_pod()
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    rec = make_reconciler(node)
    s = state(PodsReplaced((p,)))  # type: ignore[arg-type]
    await rec.reconcile(s)
    node.write(pdir, "cpu", "cpu.cfs_quota_us", -1)
    # the cache would hold the value up to 60 s (docs/behaviour-qos-manager.md, "Cgroup writes")
    rec.executor.invalidate()
    await rec.reconcile(s)
    assert cpu(node, pdir, "cpu.cfs_quota_us") == "50000"


async def test_terminated_pods_are_skipped_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = be_pod()
    done = p.model_copy(update={"phase": "Succeeded"})  # type: ignore[attr-defined]
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    rec = make_reconciler(node)
    result = await rec.reconcile(state(PodsReplaced((done,))))
    assert not any(w.parent == pdir and w.resource != "cpu.bvt_warp_ns" for w in result.writes)
    dry = make_reconciler(node, dry_run=True)
    await dry.reconcile(state(PodsReplaced((p,))))  # type: ignore[arg-type]
    assert cpu(node, pdir, "cpu.cfs_quota_us") == "-1"
    assert any(d.dry_run and d.target.endswith("cpu.cfs_quota_us") for d in dry.decisions.recent())


async def test_cgroup_v2_tree(tmp_path: Path) -> None:
    node = make_node(tmp_path, CgroupVersion.V2, extensions=())
    p = be_pod(cpu=2000)
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    rec = make_reconciler(node)
    await rec.reconcile(state(PodsReplaced((p,))))  # type: ignore[arg-type]
    assert node.read(pdir, "cpu", "cpu.max").split()[0] == "200000"  # the kernel keeps the period
    assert node.read(pdir, "cpu", "cpu.weight") == str(1 + ((2048 - 2) * 9999) // 262142)
    assert node.read(pdir, "memory", "memory.max") == str(2 * GI)


async def test_bad_pod_data_is_skipped_and_counted(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    bad = pod(
        "be2", "BE", KubeQoS.BESTEFFORT, annotations={"node.koordinator.sh/extended-resource-spec": "{bad"}
    )
    good = be_pod()
    node.add_pod(good)  # type: ignore[arg-type]
    rec = make_reconciler(node)
    result = await rec.reconcile(state(PodsReplaced((bad, good))))  # type: ignore[arg-type]
    assert "pod/be2" in result.errors
    assert any(w.resource == "cpu.cfs_quota_us" and w.value == 50000 for w in result.writes)


async def test_group_identity_rule_turns_the_sysctl_on_and_core_sched_off(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    kernel = node.proc_root / "sys/kernel"
    kernel.mkdir(parents=True)
    (kernel / "sched_group_identity_enabled").write_text("0\n")
    (kernel / "sched_core").write_text("1\n")
    rec = make_reconciler(node)
    await rec.reconcile(state(NodeSLOUpdated(parse_nodeslo(GI_SLO))))
    assert (kernel / "sched_group_identity_enabled").read_text().strip() == "1"
    assert (kernel / "sched_core").read_text().strip() == "0"


async def test_sandbox_container_of_a_pinned_nri_pod_gets_the_cpuset(tmp_path: Path) -> None:
    from koordqos.events.types import RuntimeSandbox, RuntimeSandboxUpserted

    node = make_node(tmp_path)
    sb = RuntimeSandbox(
        id="sandbox01",
        uid="lsr-uid",
        name="lsr",
        namespace="ns",
        labels={"koordinator.sh/qosClass": "LSR"},
        annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"1-2"}'},
        cgroup_parent="/kubepods/podlsr-uid",
    )
    sdir = "kubepods/podlsr-uid/sandbox01"
    node.make_cgroup(sdir)
    rec = make_reconciler(node)
    await rec.reconcile(state(RuntimeSandboxUpserted(sb)))
    assert node.read(sdir, "cpuset", "cpuset.cpus") == "1-2"
    assert cpu(node, sdir, "cpu.cfs_quota_us") == "-1"


# -- review fixes: bounded log-once memories, cookie cache pruning, sandbox runtime ----------------

BAD_SPEC = {"node.koordinator.sh/extended-resource-spec": "{bad"}


async def test_bad_pod_warning_memory_is_pruned_when_the_pod_leaves(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    node = make_node(tmp_path)
    bad = pod("be2", "BE", KubeQoS.BESTEFFORT, annotations=BAD_SPEC)
    rec = make_reconciler(node)
    with capture_logs() as logs:
        await rec.reconcile(state(PodsReplaced((bad,))))
        await rec.reconcile(state(PodsReplaced((bad,))))
        assert len([e for e in logs if e["event"] == "pod skipped by the hooks reconciler"]) == 1
        assert len(rec.planner.warned) == 1
        await rec.reconcile(state(PodsReplaced(())))
        assert len(rec.planner.warned) == 0
        await rec.reconcile(state(PodsReplaced((bad,))))  # came back: reported again
    assert len([e for e in logs if e["event"] == "pod skipped by the hooks reconciler"]) == 2


async def test_bad_pod_warning_memory_is_bounded(tmp_path: Path) -> None:
    from koordqos.hooks.reconcile_plan import MAX_WARNED

    node = make_node(tmp_path)
    rec = make_reconciler(node)
    pods = tuple(
        pod(f"bad{i}", "BE", KubeQoS.BESTEFFORT, annotations=BAD_SPEC) for i in range(MAX_WARNED + 5)
    )
    rec.compute(state(PodsReplaced(pods)))
    assert 0 < len(rec.planner.warned) <= MAX_WARNED


async def test_failing_pass_is_logged_once_and_counted_every_time(tmp_path: Path) -> None:
    import asyncio

    from structlog.testing import capture_logs

    from koordqos import observability as obs
    from koordqos.bus import EventBus
    from koordqos.hooks.reconciler import PassResult

    node = make_node(tmp_path)
    base = make_reconciler(node)
    rec = HookReconciler(
        base.hooks, node.layout, base.executor, base.host, base.decisions, bus=EventBus(), interval=0.001
    )
    calls = 0

    async def failing(state: NodeState, trigger: str = "manual") -> PassResult:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom" if calls < 4 else "other")

    rec.reconcile = failing  # type: ignore[method-assign]
    counter = obs.ERRORS.labels("hooks-reconciler", "pass")
    before = counter._value.get()
    with capture_logs() as logs:
        task = asyncio.create_task(rec.run())
        await wait_until(lambda: calls >= 6, timeout=10, message="six reconcile passes")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    failed = [e for e in logs if e["event"] == "reconcile pass failed"]
    assert [e["error"] for e in failed] == ["RuntimeError: boom", "RuntimeError: other"]
    assert counter._value.get() == before + calls


def _core_sched_reconciler(node: SyntheticNode, kernel: FakeCookieKernel) -> HookReconciler:
    from koordqos.cgroups.executor import CgroupExecutor
    from koordqos.decisions import DecisionLog
    from koordqos.hooks.runtime import HookOptions, RuntimeHooks
    from koordqos.host import HostActuator

    hooks = RuntimeHooks(
        HookOptions(
            gates={"CoreSched": True, "GroupIdentity": False},
            core_sched_supported=True,
            core_sched_reason="test",
        )
    )
    decisions = DecisionLog()
    host = HostActuator(decisions, proc_root=node.proc_root, cookie_ops=kernel)
    return HookReconciler(hooks, node.layout, CgroupExecutor(node.layout, decisions), host, decisions)


CORE_SCHED_SLO = {
    "resourceQOSStrategy": {
        "policies": {"cpuPolicy": "coreSched"},
        "lsClass": {"cpuQOS": {"enable": True}},
    }
}


async def test_core_sched_caches_forget_containers_and_processes_that_left(tmp_path: Path) -> None:
    node = make_node(tmp_path, extensions=("cpu.idle",))
    cid = "containerd://" + "ab" * 8
    p = pod("ls1", "LS", KubeQoS.BURSTABLE, [ContainerInfo(name="c0", container_id=cid)])
    pdir = node.add_pod(p)
    cdir = node.layout.container_dir_in(pdir, cid)
    node.write(cdir, "cpu", "cgroup.procs", "100\n101\n")
    for pid in (100, 101):
        (node.proc_root / str(pid)).mkdir(parents=True)
    kernel = FakeCookieKernel()
    rec = _core_sched_reconciler(node, kernel)
    slo = NodeSLOUpdated(parse_nodeslo(CORE_SCHED_SLO))
    await rec.reconcile(state(PodsReplaced((p,)), slo))
    cookies = rec.host.cookies
    assert cookies is not None
    assert set(cookies.groups) == {f"ls1/{cid}"}
    assert kernel.cookies[100] == kernel.cookies[101] != 0
    # the pod is deleted and its processes exit
    for pid in (100, 101):
        (node.proc_root / str(pid)).rmdir()
    await rec.reconcile(state(PodsReplaced(()), slo))
    assert cookies.groups == {}
    assert cookies.cookies == {}


async def test_sandbox_id_takes_the_runtime_of_the_first_container(tmp_path: Path) -> None:
    from koordqos.cgroups.layout import CgroupDriver
    from koordqos.events.types import RuntimeSandbox, RuntimeSandboxUpserted

    node = SyntheticNode(tmp_path / "node", CgroupVersion.V1, CgroupDriver.SYSTEMD)
    cid = "cri-o://" + "cd" * 8
    annotations = {"scheduling.koordinator.sh/resource-status": '{"cpuset":"1-2"}'}
    p = pod("lsr-uid", "LSR", KubeQoS.GUARANTEED, [ContainerInfo(name="c0", container_id=cid)], annotations)
    pdir = node.add_pod(p)
    sdir = node.layout.container_dir_in(pdir, "cri-o://sandbox01")
    assert sdir.endswith("/crio-sandbox01.scope")
    node.make_cgroup(sdir)
    sb = RuntimeSandbox(
        id="sandbox01",
        uid="lsr-uid",
        name="lsr-uid",
        namespace="ns",
        labels=p.labels,
        annotations=annotations,
    )
    rec = make_reconciler(node)
    result = await rec.reconcile(state(PodsReplaced((p,)), RuntimeSandboxUpserted(sb)))
    assert node.read(sdir, "cpuset", "cpuset.cpus") == "1-2"
    assert any(w.parent == sdir for w in result.writes)
    assert not any("cri-containerd-sandbox01" in w.parent for w in result.writes)


def test_sandbox_runtime_fallbacks() -> None:
    from koordqos.events.types import RuntimeContainer
    from koordqos.hooks.podviews import sandbox_runtime

    docker = pod("u", "LS", KubeQoS.BURSTABLE, [ContainerInfo(name="c", container_id="docker://abc")])
    assert sandbox_runtime(docker, {}, ()) == "docker"
    not_started = pod("u", "LS", KubeQoS.BURSTABLE, [ContainerInfo(name="c")])
    assert sandbox_runtime(not_started, {}, ()) == "containerd"
    crio = RuntimeContainer(
        id="x", sandbox_id="s", pod_uid="u", name="c", cgroups_path="kubepods.slice:crio:x"
    )
    assert sandbox_runtime(None, {}, (crio,)) == "cri-o"
    assert sandbox_runtime(None, {"io.kubernetes.docker.type": "podsandbox"}, ()) == "docker"
    assert sandbox_runtime(None, {}, ()) == "containerd"


async def test_dry_run_host_writes_are_recorded_and_change_nothing(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    kernel = node.proc_root / "sys/kernel"
    kernel.mkdir(parents=True)
    (kernel / "sched_group_identity_enabled").write_text("0\n")
    app = ContainerInfo(name="c1", container_id="containerd://appc")
    p = pod("o", "LS", KubeQoS.BURSTABLE, [app], {"koordinator.sh/oom-score-adj": "-500"})
    pdir = node.add_pod(p)
    node.write(node.layout.container_dir_in(pdir, "containerd://appc"), "cpu", "cgroup.procs", 22)
    (node.proc_root / "22").mkdir()
    (node.proc_root / "22/oom_score_adj").write_text("0\n")
    rec = make_reconciler(node, {"OOMScoreAdj": True}, dry_run=True)
    await rec.reconcile(state(PodsReplaced((p,)), NodeSLOUpdated(parse_nodeslo(GI_SLO))))
    assert (node.proc_root / "22/oom_score_adj").read_text().strip() == "0"
    assert (kernel / "sched_group_identity_enabled").read_text().strip() == "0"
    recorded = {(d.target, d.new) for d in rec.decisions.recent() if d.dry_run}
    assert ("pid/22/oom_score_adj", -500) in recorded
    assert ("sysctl/kernel/sched_group_identity_enabled", "1") in recorded


async def test_one_pods_unexpected_failure_never_aborts_the_pass_for_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue #15 item 1: a RecursionError from one pod's annotation failed every pass for every pod
    from koordqos.hooks import reconcile_plan

    node = make_node(tmp_path)
    bad, good = be_pod("bad1"), be_pod("good1")
    bad_dir = node.add_pod(bad)  # type: ignore[arg-type]
    good_dir = node.add_pod(good)  # type: ignore[arg-type]
    real = reconcile_plan.pod_context

    def pod_context(view: Any, layout: Any) -> Any:
        if view.uid == "bad1":
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
        return real(view, layout)

    monkeypatch.setattr(reconcile_plan, "pod_context", pod_context)
    rec = make_reconciler(node)
    result = await rec.reconcile(state(PodsReplaced((bad, good))))  # type: ignore[arg-type]
    assert cpu(node, good_dir, "cpu.cfs_quota_us") == "50000"  # the other pod was reconciled
    assert cpu(node, bad_dir, "cpu.cfs_quota_us") == "-1"
    assert "RecursionError" in result.errors["pod/bad1"]
    # none of the failed pod's own (partial) intents were kept
    assert not any(w.parent.startswith(bad_dir) and w.resource == "cpu.cfs_quota_us" for w in result.writes)


# -- incremental passes: only pods whose inputs changed, plus a slow full pass (#18) ---------------


def _drifting_reconciler(node: SyntheticNode, **kwargs: Any) -> tuple[HookReconciler, list[float]]:
    """A reconciler on a bus whose executor runs on a clock the test moves (to let a cached value expire)."""
    from koordqos.bus import EventBus
    from koordqos.cgroups.executor import CgroupExecutor

    base = make_reconciler(node)
    now = [0.0]
    executor = CgroupExecutor(node.layout, base.decisions, clock=lambda: now[0])
    rec = HookReconciler(
        base.hooks, node.layout, executor, base.host, base.decisions, bus=EventBus(), **kwargs
    )
    return rec, now


async def test_only_the_changed_pod_is_replanned(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p1, p2 = be_pod("be1"), be_pod("be2")
    d1, d2 = node.add_pod(p1), node.add_pod(p2)  # type: ignore[arg-type]
    rec = make_reconciler(node)
    first = await rec.reconcile(state(PodsReplaced((p1, p2))))  # type: ignore[arg-type]
    assert first.full
    assert sorted(first.planned) == ["be1", "be2"]  # NodeState maps have no defined order
    node.write(d1, "cpu", "cpu.cfs_quota_us", -1)  # p1 drifts, but nothing about p1 changed
    rec.executor.invalidate()
    p2_more = be_pod("be2", cpu=800)
    result = await rec.reconcile(state(PodsReplaced((p1, p2_more))), "PodUpserted")  # type: ignore[arg-type]
    assert not result.full
    assert result.planned == ["be2"]
    assert not any(w.parent.startswith(d1) for w in result.writes)
    assert cpu(node, d2, "cpu.cfs_quota_us") == "80000"
    assert cpu(node, d1, "cpu.cfs_quota_us") == "-1"  # not re-planned, so not re-applied
    # what the pass carries over for the unchanged pod: its containers (core-sched pruning reads them)
    assert {"be1/containerd://be1c0", "be2/containerd://be2c0"} <= result.containers
    unchanged = await rec.reconcile(state(PodsReplaced((p1, p2_more))), "interval")  # type: ignore[arg-type]
    assert unchanged.planned == []
    assert not unchanged.full
    full = await rec.reconcile(state(PodsReplaced((p1, p2_more))))  # type: ignore[arg-type]
    assert full.full
    assert sorted(full.planned) == ["be1", "be2"]
    assert cpu(node, d1, "cpu.cfs_quota_us") == "50000"


async def test_a_nodeslo_change_makes_the_pass_full(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = be_pod()
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    rec = make_reconciler(node)
    await rec.reconcile(state(PodsReplaced((p,)), NodeSLOUpdated(parse_nodeslo({}))))  # type: ignore[arg-type]
    s = state(PodsReplaced((p,)), NodeSLOUpdated(parse_nodeslo(CFS_SUPPRESS_SLO)))  # type: ignore[arg-type]
    result = await rec.reconcile(s, "NodeSLOUpdated")
    assert result.full
    assert result.planned == ["be1"]
    assert cpu(node, pdir, "cpu.cfs_quota_us") == "-1"


async def test_a_pod_whose_dir_is_missing_is_planned_again_until_it_lands(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = be_pod()
    rec = make_reconciler(node)
    s = state(PodsReplaced((p,)))  # type: ignore[arg-type]
    await rec.reconcile(s)  # no pod dir yet: the writes find it vanished
    again = await rec.reconcile(s, "interval")
    assert again.planned == ["be1"]
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    landed = await rec.reconcile(s, "interval")
    assert landed.planned == ["be1"]
    assert cpu(node, pdir, "cpu.cfs_quota_us") == "50000"
    settled = await rec.reconcile(s, "interval")
    assert settled.planned == []


async def test_the_slow_full_pass_reapplies_a_file_changed_behind_our_back(tmp_path: Path) -> None:
    import asyncio

    node = make_node(tmp_path)
    p1, p2 = be_pod("be1"), be_pod("be2")
    d1 = node.add_pod(p1)  # type: ignore[arg-type]
    node.add_pod(p2)  # type: ignore[arg-type]
    rec, now = _drifting_reconciler(node, interval=0.01, settle=0.01, full_interval=3600)
    assert rec.bus is not None
    rec.bus.publish_nowait(PodsReplaced((p1, p2)))  # type: ignore[arg-type]
    task = asyncio.create_task(rec.run())
    try:
        await wait_until(lambda: cpu(node, d1, "cpu.cfs_quota_us") == "50000", timeout=10, message="applied")
        node.write(d1, "cpu", "cpu.cfs_quota_us", -1)
        now[0] = 61.0  # the executor's cache no longer holds the value (force_update_seconds = 60)
        rec.bus.publish_nowait(PodsReplaced((p1, be_pod("be2", cpu=800))))  # type: ignore[arg-type]
        passes = rec.passes
        await wait_until(lambda: rec.passes >= passes + 5, timeout=10, message="five incremental passes")
        assert cpu(node, d1, "cpu.cfs_quota_us") == "-1"  # incremental passes leave the unchanged pod alone
        assert rec.last is not None
        assert not rec.last.full
        rec.full_interval = 0.05  # now the slow full pass is due
        await wait_until(lambda: cpu(node, d1, "cpu.cfs_quota_us") == "50000", timeout=10, message="restored")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_pass_that_fails_half_way_makes_the_next_one_full(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = be_pod()
    pdir = node.add_pod(p)  # type: ignore[arg-type]
    rec = make_reconciler(node)
    s = state(PodsReplaced((p,)))  # type: ignore[arg-type]
    original = rec.executor.apply

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("the executor failed")

    rec.executor.apply = broken  # type: ignore[method-assign]
    with pytest.raises(OSError, match="executor failed"):
        await rec.reconcile(s)
    rec.executor.apply = original  # type: ignore[method-assign]
    result = await rec.reconcile(s, "interval")
    assert result.full
    assert result.planned == ["be1"]
    assert cpu(node, pdir, "cpu.cfs_quota_us") == "50000"


def test_the_full_pass_period_follows_the_executor_cache(tmp_path: Path) -> None:
    from koordqos.cgroups.executor import CgroupExecutor

    node = make_node(tmp_path)
    base = make_reconciler(node)
    for force, interval, want in ((60.0, 10.0, 60.0), (0.0, 0.2, 0.2), (30.0, 120.0, 120.0)):
        executor = CgroupExecutor(node.layout, base.decisions, force_update_seconds=force)
        rec = HookReconciler(base.hooks, node.layout, executor, base.host, base.decisions, interval=interval)
        assert rec.full_interval == want
