"""What the hook plugins are built from: config values and the node's capabilities (probed once)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.features import DEFAULT_GATES


@dataclass(frozen=True)
class BvtSystem:
    """What the kernel offers for group identity (probed once by the caller).

    `sysctl_enabled` is None when `/proc/sys/kernel/sched_group_identity_enabled` is absent, and
    `sysctl_error` is set when the file exists but could not be read.
    """

    bvt_file: bool = False
    idle_file: bool = False
    sysctl_enabled: bool | None = None
    sysctl_error: str = ""

    @property
    def supported(self) -> bool:
        """Group identity can be applied: bvt file, sysctl, or the cpu.idle fallback."""
        return self.bvt_file or self.sysctl_enabled is not None or bool(self.sysctl_error) or self.idle_file


@dataclass
class HookOptions:
    """Construction options (from config and the node's capabilities)."""

    gates: Mapping[str, bool] = field(default_factory=dict)
    disable_unset_cpu_quota: bool = False
    bvt: BvtSystem = field(default_factory=BvtSystem)
    core_sched_supported: bool = False
    core_sched_reason: str = "not probed"
    resctrl_root: Path | None = None  # the mounted resctrl (`<sys>/fs/resctrl`); None without L3 CAT
    cpu_idle_on_qos_dirs: bool = False  # koordlet's cpu.idle on kube-QoS dirs (project decision: per pod)
    sys_root: Path = Path("/sys")  # RDMA: the PCI devices' uverbs
    dev_root: Path = Path("/dev")  # RDMA: the device nodes' numbers

    def gate(self, name: str) -> bool:
        """A feature gate, koordlet's default when not set."""
        return self.gates.get(name, DEFAULT_GATES.get(name, False))
