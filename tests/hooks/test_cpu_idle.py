"""cpu.idle=1 never on kubepods/besteffort, per BE pod only (issue #15 item 14): CoreSched's schedIdle and
GroupIdentity's cpu.idle fallback; koordlet's QoS-dir write behind --cpu-idle-on-qos-dirs; and why, on this
machine's kernel: an idle cgroup refuses the cpu.shares write kubelet makes on its QoS dirs."""

from __future__ import annotations

import errno

import pytest

from koordqos.cgroups.executor import CgroupExecutor, CgroupWrite, Level, Outcome
from koordqos.decisions import DecisionLog
from koordqos.hooks.context import KubeQoSContext, PodContext, PodRequest
from koordqos.hooks.coresched import CoreSched, CoreSchedRule, Param
from koordqos.hooks.groupidentity import GroupIdentity
from koordqos.hooks.options import BvtSystem
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.testing.scratchcg import REAL_ROOT, Scratch, unavailable_reason

IDLE_BE = CoreSchedRule(
    True,
    {QoSClass.BE: Param(True, False, True), QoSClass.LS: Param(True, True, False)},
    {KubeQoS.BESTEFFORT: Param(True, False, True), KubeQoS.BURSTABLE: Param(True, True, False)},
)


def _pod(qos: str, parent: str) -> PodContext:
    return PodContext(PodRequest(uid="u", labels={"koordinator.sh/qosClass": qos}, cgroup_parent=parent))


def test_core_sched_sets_cpu_idle_per_be_pod_and_never_on_the_besteffort_dir() -> None:
    h = CoreSched(True, "test")
    h.rule = IDLE_BE
    be_dir = KubeQoSContext(KubeQoS.BESTEFFORT, "kubepods/besteffort")
    h.set_kube_qos_cpu_idle(be_dir)
    assert be_dir.response.resources.cpu_idle == 0
    be_pod = _pod("BE", "/kubepods/besteffort/podu")
    h.set_pod_cpu_idle(be_pod)
    assert be_pod.response.resources.cpu_idle == 1
    ls_pod = _pod("LS", "/kubepods/burstable/podu")
    h.set_pod_cpu_idle(ls_pod)
    assert ls_pod.response.resources.cpu_idle == 0


def test_koordlets_qos_dir_behaviour_behind_the_flag() -> None:
    h = CoreSched(True, "test", idle_on_qos_dirs=True)
    h.rule = IDLE_BE
    be_dir = KubeQoSContext(KubeQoS.BESTEFFORT, "kubepods/besteffort")
    h.set_kube_qos_cpu_idle(be_dir)
    assert be_dir.response.resources.cpu_idle == 1
    be_pod = _pod("BE", "/kubepods/besteffort/podu")
    h.set_pod_cpu_idle(be_pod)
    assert be_pod.response.resources.cpu_idle is None


def test_group_identity_idle_fallback_marks_be_pods_not_the_besteffort_dir() -> None:
    from koordqos.hooks.groupidentity import BvtRule

    h = GroupIdentity(BvtSystem(bvt_file=False, idle_file=True))
    h.rule = BvtRule(
        enable=True,
        pod_qos_params={QoSClass.LS: 2, QoSClass.BE: -1},
        kube_qos_dir_params={KubeQoS.GUARANTEED: 0, KubeQoS.BURSTABLE: 2, KubeQoS.BESTEFFORT: -1},
    )
    be_dir = KubeQoSContext(KubeQoS.BESTEFFORT, "kubepods/besteffort")
    h.set_kube_qos_bvt_value(be_dir)
    assert be_dir.response.resources.cpu_idle == 0
    be_pod = _pod("BE", "/kubepods/besteffort/podu")
    h.set_pod_bvt_value(be_pod)
    assert be_pod.response.resources.cpu_idle == 1


@pytest.mark.cgroupv1
async def test_on_this_kernel_an_idle_qos_dir_refuses_kubelets_shares_write_and_ours_does_not() -> None:
    reason = unavailable_reason()
    if reason is None and not (REAL_ROOT / "cpu" / "cpu.idle").exists():
        reason = "this kernel has no cpu.idle"
    if reason is not None:
        pytest.skip(reason)
    scratch = Scratch()
    try:
        scratch.mkcg("")
        besteffort = scratch.mkcg("besteffort")
        pod = scratch.mkcg("besteffort/podu")
        # koordlet's write: the QoS dir idle → kubelet's cpu.shares write there fails
        (scratch.path(besteffort, "cpu", "cpu.idle")).write_text("1")
        with pytest.raises(OSError, match="Invalid argument") as info:
            scratch.path(besteffort, "cpu", "cpu.shares").write_text("2")
        assert info.value.errno == errno.EINVAL
        (scratch.path(besteffort, "cpu", "cpu.idle")).write_text("0")
        # koordqos's plan: the dir 0, the BE pod 1; kubelet's write on the dir then works
        h = CoreSched(True, "test")
        h.rule = IDLE_BE
        dir_ctx = KubeQoSContext(KubeQoS.BESTEFFORT, besteffort)
        h.set_kube_qos_cpu_idle(dir_ctx)
        pod_ctx = _pod("BE", f"/{pod}")
        h.set_pod_cpu_idle(pod_ctx)
        ex = CgroupExecutor(scratch.layout, DecisionLog())
        results = await ex.apply(
            "test",
            [
                CgroupWrite(besteffort, "cpu.idle", dir_ctx.response.resources.cpu_idle or 0, Level.QOS),
                CgroupWrite(pod, "cpu.idle", pod_ctx.response.resources.cpu_idle or 0, Level.POD),
            ],
        )
        assert all(r.outcome in (Outcome.WRITTEN, Outcome.UNCHANGED) for r in results), results
        assert scratch.read(besteffort, "cpu", "cpu.idle") == "0"
        assert scratch.read(pod, "cpu", "cpu.idle") == "1"
        scratch.path(besteffort, "cpu", "cpu.shares").write_text("2")  # kubelet's write succeeds
        assert scratch.read(besteffort, "cpu", "cpu.shares") == "2"
    finally:
        scratch.cleanup()


def test_an_idle_pod_gets_no_shares_write_and_idle_goes_before_shares() -> None:
    """The kernel refuses cpu.shares / cpu.weight on an idle group (EINVAL; found in the v2 VM, where the
    BE pod's BatchResource shares failed every reconcile once GroupIdentity's fallback made it idle), and
    clearing cpu.idle resets the weight: no shares for an idle pod, and idle written before shares."""
    from koordqos.hooks.completion import pod_writes

    idle = _pod("BE", "kubepods/besteffort/podu")
    idle.response.resources.cpu_idle = 1
    idle.response.resources.cpu_shares = 1024
    idle.response.resources.memory_limit = 1 << 30
    assert [w.resource for w in pod_writes(idle)] == ["cpu.idle", "memory.limit_in_bytes"]
    busy = _pod("BE", "kubepods/besteffort/podu")
    busy.response.resources.cpu_idle = 0
    busy.response.resources.cpu_shares = 1024
    assert [(w.resource, w.value) for w in pod_writes(busy)] == [("cpu.idle", 0), ("cpu.shares", 1024)]
    plain = _pod("BE", "kubepods/besteffort/podu")
    plain.response.resources.cpu_shares = 1024
    assert [w.resource for w in pod_writes(plain)] == ["cpu.shares"]


@pytest.mark.cgroupv1
async def test_on_this_kernel_an_idle_pod_gets_its_batch_values_without_a_refused_write() -> None:
    """This machine's v1 kernel, as the v2 VM's: GroupIdentity's fallback and BatchResource on a BE pod
    dir (cpu.idle 1, shares 1024, memory limit) apply with no refused write; the idle dir refuses a
    cpu.shares write, which is why none is made."""
    reason = unavailable_reason()
    if reason is None and not (REAL_ROOT / "cpu" / "cpu.idle").exists():
        reason = "this kernel has no cpu.idle"
    if reason is not None:
        pytest.skip(reason)
    from koordqos.hooks.completion import pod_writes

    scratch = Scratch()
    try:
        scratch.mkcg("")
        scratch.mkcg("besteffort")
        pod = scratch.mkcg("besteffort/podu")
        ctx = _pod("BE", pod)
        ctx.response.resources.cpu_idle = 1
        ctx.response.resources.cpu_shares = 1024
        ctx.response.resources.memory_limit = 1 << 30
        ex = CgroupExecutor(scratch.layout, DecisionLog())
        results = await ex.apply("test", pod_writes(ctx))
        assert all(r.ok for r in results), [(r.write.resource, r.outcome, r.error) for r in results]
        assert scratch.read(pod, "cpu", "cpu.idle") == "1"
        assert scratch.read(pod, "memory", "memory.limit_in_bytes") == str(1 << 30)
        with pytest.raises(OSError, match="Invalid argument"):
            scratch.path(pod, "cpu", "cpu.shares").write_text("1024")
    finally:
        scratch.cleanup()
