"""RDMADeviceInject: the pod's RDMA devices as device nodes of its containers (docs/devices.md,
"RDMADeviceInject").

PreCreateContainer hook `rdma device inject`, for the `rdma` entries of the scheduler's device allocation:
`/dev/infiniband/rdma_cm`, then for each device the `uverbs` node of each virtual function (by its `busID`)
or, without VFs, of the device itself (its `id`, a PCI address): the node named in
`<sys>/bus/pci/devices/<pci>/infiniband_verbs/`. Major and minor are read from the node under `--dev-root`;
each device goes into the NRI adjustment as a char device with mode 0666. Anything missing is an error (as
koordlet); a PCI address that is not one (a hostile annotation) is refused before any path is built.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from koordqos.errors import ModelError
from koordqos.hooks.context import ContainerContext, LinuxDevice, Stage
from koordqos.hooks.framework import HookFn, HookPlugin, HookSpec
from koordqos.hooks.options import HookOptions
from koordqos.model.devices import RDMA, device_allocations

NAME = "rdma device inject"
GATE = "RDMADeviceInject"
IB_DIR = "infiniband"  # beneath /dev
RDMA_CM = "rdma_cm"
PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
DEVICE_MODE = 0o666


class RDMADeviceInject(HookPlugin):
    """The hook plugin (no rule, no reconciler)."""

    name = NAME

    def __init__(self, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> None:
        self.sys_root = Path(sys_root)
        self.dev_root = Path(dev_root)

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {Stage.PRE_CREATE_CONTAINER: ("inject rdma devices into container", self.inject)}

    def _device(self, name: str) -> LinuxDevice:
        """The char device `/dev/infiniband/<name>` with the numbers of the node under the dev root."""
        try:
            st = os.stat(self.dev_root / IB_DIR / name, follow_symlinks=False)
        except OSError as exc:
            raise ModelError(f"rdma: /dev/{IB_DIR}/{name}: {exc.strerror}") from None
        if not stat.S_ISCHR(st.st_mode):
            raise ModelError(f"rdma: /dev/{IB_DIR}/{name}: not a character device")
        return LinuxDevice(
            f"/dev/{IB_DIR}/{name}", os.major(st.st_rdev), os.minor(st.st_rdev), "c", DEVICE_MODE
        )

    def _uverbs(self, pci: str) -> str:
        if not PCI_ADDRESS.match(pci):
            raise ModelError(f"rdma: not a PCI address: {pci[:32]!r}")
        verbs = self.sys_root / "bus" / "pci" / "devices" / pci / "infiniband_verbs"
        try:
            names = sorted(os.listdir(verbs))
        except OSError as exc:
            raise ModelError(f"rdma: {pci}: no uverbs ({exc.strerror})") from None
        if not names:
            raise ModelError(f"rdma: {pci}: no uverbs")
        return names[0]

    def inject(self, ctx: ContainerContext | None) -> None:
        """Fill the response's devices."""
        if ctx is None:
            raise ValueError("nil container context")
        if ctx.request.sandbox:
            return
        devices = device_allocations(ctx.request.pod_annotations).get(RDMA)
        if not devices:
            return
        out = [self._device(RDMA_CM)]
        for dev in devices:
            for pci in [vf.bus_id for vf in dev.vfs] or [dev.id]:
                out.append(self._device(self._uverbs(pci)))
        ctx.response.add_devices = out


def _build(opts: HookOptions) -> RDMADeviceInject:
    return RDMADeviceInject(opts.sys_root, opts.dev_root)


HOOK: HookSpec[RDMADeviceInject] = HookSpec(NAME, GATE, _build)
