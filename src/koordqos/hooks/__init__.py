"""Runtime hooks: static per-pod/per-container settings (batch resources, group identity, cpuset, cpu
normalization, oom score, core scheduling) applied when the runtime creates pods and containers, and kept
true by the reconciler.

`setup(ctx)` builds `RuntimeHooks` from the feature gates (service "runtime_hooks"), attaches the NRI
conversion to the NRI request events, and returns the reconciler component (service "hooks_reconciler").
The framework (contexts, registry, runner) is independent of NRI: `koordqos.nri.convert` holds the NRI
specifics, and a proxy hook service can reuse `RuntimeHooks.run_stage` with its own conversion.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from koordqos.hooks.groupidentity import BvtSystem
from koordqos.hooks.runtime import HookOptions, RuntimeHooks

if TYPE_CHECKING:
    from koordqos.agent import AgentContext, Component
    from koordqos.cgroups.layout import CgroupLayout

log = structlog.get_logger("koordqos.hooks")

__all__ = ["HookOptions", "RuntimeHooks", "probe_bvt_system", "setup"]


def probe_bvt_system(layout: CgroupLayout, proc_root: Path) -> BvtSystem:
    """What the kernel offers for group identity (bvt file, cpu.idle, the sysctl)."""
    sysctl = proc_root / "sys/kernel/sched_group_identity_enabled"
    enabled: bool | None = None
    error = ""
    if sysctl.exists():
        try:
            enabled = sysctl.read_text().strip() == "1"
        except OSError as exc:
            error = exc.strerror or str(exc)
    return BvtSystem(
        bvt_file=layout.supports("cpu.bvt_warp_ns"),
        idle_file=layout.supports("cpu.idle"),
        sysctl_enabled=enabled,
        sysctl_error=error,
    )


def setup(ctx: AgentContext) -> list[Component]:
    """Build the enabled hooks, register the NRI conversion and return the reconciler."""
    from koordqos.cgroups.executor import CgroupExecutor
    from koordqos.cgroups.layout import CgroupLayout
    from koordqos.hooks.framework import parse_failure_policy
    from koordqos.hooks.reconciler import HookReconciler

    cfg = ctx.config
    layout = ctx.services.get("cgroup_layout")
    if not isinstance(layout, CgroupLayout):
        layout = CgroupLayout.detect(
            cfg.paths.cgroup_root, proc_root=cfg.paths.proc_root, sys_root=cfg.paths.sys_root
        )
        ctx.services["cgroup_layout"] = layout
    executor = ctx.services.get("executor")
    if not isinstance(executor, CgroupExecutor):
        executor = CgroupExecutor(
            layout,
            ctx.decisions,
            dry_run=cfg.dry_run or None,
            force_update_seconds=cfg.executor.resource_force_update_seconds,
        )
        ctx.services["executor"] = executor
    policy = parse_failure_policy(cfg.hooks.failure_policy)
    core_ok, core_reason = (False, "gate off")
    if cfg.gate("CoreSched"):
        core_ok, core_reason = layout.core_sched_supported()
    hooks = RuntimeHooks(
        HookOptions(
            gates=cfg.feature_gates,
            disable_unset_cpu_quota=cfg.hooks.disable_unset_cpu_quota,
            bvt=probe_bvt_system(layout, Path(cfg.paths.proc_root)),
            core_sched_supported=core_ok,
            core_sched_reason=core_reason,
        )
    )
    ctx.services["runtime_hooks"] = hooks
    if cfg.nri.enabled:
        from koordqos.nri.convert import NRIHooks

        NRIHooks(hooks, layout, executor, policy, decisions=ctx.decisions).register(ctx.bus)
    reconciler = HookReconciler(
        hooks,
        layout,
        executor,
        ctx.services["host_actuator"],
        ctx.decisions,
        bus=ctx.bus,
        interval=cfg.hooks.reconcile_interval_seconds,
    )
    ctx.services["hooks_reconciler"] = reconciler
    ctx.status["runtime_hooks"] = {"enabled": hooks.names, "failure_policy": policy}
    log.info(
        "runtime hooks",
        enabled=hooks.names,
        policy=policy,
        bvt=hooks.group_identity is not None and hooks.group_identity.system.supported,
        core_sched=core_reason,
    )
    return [reconciler]
