"""Runtime hooks: static per-pod/per-container settings (batch resources, group identity, cpuset, cpu
normalization, oom score, core scheduling) applied when the runtime creates pods and containers, and kept
true by the reconciler.

The hook core (`core.py`: stages run under a deadline and the failure policy) is independent of any
protocol: `koordqos.nri` and `koordqos.proxy` translate their messages into the contexts of `context.py` and
back. A hook is one module registered in `registry.py`. `build_runtime_hooks` builds the enabled hooks from
the config and the node's capabilities.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from koordqos.hooks.options import BvtSystem, HookOptions
from koordqos.hooks.runtime import RuntimeHooks

if TYPE_CHECKING:
    from koordqos.cgroups.layout import CgroupLayout
    from koordqos.config import AgentConfig

__all__ = ["HookOptions", "RuntimeHooks", "build_runtime_hooks", "probe_bvt_system"]


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


def probe_resctrl(config: AgentConfig) -> Path | None:
    """The resctrl mount with L3 CAT when the Resctrl gate is on (checked once at start)."""
    root = Path(config.paths.sys_root) / "fs" / "resctrl"
    if config.gate("Resctrl") and (root / "info" / "L3").is_dir():
        return root
    return None


def build_runtime_hooks(config: AgentConfig, layout: CgroupLayout) -> RuntimeHooks:
    """The hooks the feature gates enable, built for what this node's kernel offers."""
    core_ok, core_reason = (False, "gate off")
    if config.gate("CoreSched"):
        core_ok, core_reason = layout.core_sched_supported()
    return RuntimeHooks(
        HookOptions(
            gates=config.feature_gates,
            disable_unset_cpu_quota=config.hooks.disable_unset_cpu_quota,
            bvt=probe_bvt_system(layout, Path(config.paths.proc_root)),
            core_sched_supported=core_ok,
            core_sched_reason=core_reason,
            resctrl_root=probe_resctrl(config),
            cpu_idle_on_qos_dirs=config.hooks.cpu_idle_on_qos_dirs,
            sys_root=Path(config.paths.sys_root),
            dev_root=Path(config.paths.dev_root),
        )
    )
