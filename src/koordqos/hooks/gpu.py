"""GPUEnvInject: `NVIDIA_VISIBLE_DEVICES` from the scheduler's device allocation (docs/devices.md,
"GPUEnvInject").

PreCreateContainer hook `gpu env inject`: the minors of the pod's `gpu` allocation joined by `,`. With the
pod label `koordinator.sh/gpu-isolation-provider: HAMi-core` and a GPU memory ratio below 100 it also sets
HAMi-core's limits (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`, `LD_PRELOAD`) and bind-mounts the
library and `/tmp/vgpulock` (mounts reach the container through NRI only). A malformed annotation, or a
HAMi-core pod without the ratio or the memory, is an error (logged and counted by the hook core; under
`Fail` the runtime is told). koordlet's HamiCoreVGPUMonitor extension (a host cache dir per container) is
not done here (docs/devices.md).
"""

from __future__ import annotations

from koordqos.errors import ModelError
from koordqos.hooks.context import ContainerContext, Mount, Stage
from koordqos.hooks.framework import HookFn, HookPlugin, HookSpec
from koordqos.model.devices import (
    GPU,
    HAMI_CORE,
    LABEL_GPU_ISOLATION_PROVIDER,
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
    device_allocations,
)

NAME = "gpu env inject"
GATE = "GPUEnvInject"
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"  # koordlet's HAMICoreLibraryDirectoryPath
VGPU_LOCK = "/tmp/vgpulock"


class GPUEnvInject(HookPlugin):
    """The hook plugin (no rule, no reconciler: env is set when the container is created)."""

    name = NAME

    def stage_hooks(self) -> dict[Stage, tuple[str, HookFn]]:
        """Stage → (description, fn)."""
        return {Stage.PRE_CREATE_CONTAINER: ("inject NVIDIA_VISIBLE_DEVICES env into container", self.inject)}

    def inject(self, ctx: ContainerContext | None) -> None:
        """Fill the env (and, for HAMi-core, the mounts) of the response."""
        if ctx is None:
            raise ValueError("nil container context")
        req = ctx.request
        if req.sandbox:
            return
        gpus = device_allocations(req.pod_annotations).get(GPU)
        if not gpus:
            return
        envs = ctx.response.add_envs
        envs[ENV_VISIBLE_DEVICES] = ",".join(str(d.minor) for d in gpus)
        if req.pod_labels.get(LABEL_GPU_ISOLATION_PROVIDER) != HAMI_CORE:
            return
        res = gpus[0].resources
        ratio = res.get(RESOURCE_GPU_MEMORY_RATIO)
        if ratio is None:
            raise ModelError("HAMi-core: gpu memory ratio not found in the gpu allocation")
        if ratio >= 100:
            return
        memory = res.get(RESOURCE_GPU_MEMORY)
        if memory is None:
            raise ModelError("HAMi-core: gpu memory not found in the gpu allocation")
        envs["CUDA_DEVICE_MEMORY_LIMIT"] = str(memory)
        core = res.get(RESOURCE_GPU_CORE)
        if core is not None:
            envs["CUDA_DEVICE_SM_LIMIT"] = str(core)
        envs["LD_PRELOAD"] = HAMI_LIBRARY
        ctx.response.add_mounts += [Mount(HAMI_LIBRARY, HAMI_LIBRARY), Mount(VGPU_LOCK, VGPU_LOCK)]


HOOK: HookSpec[GPUEnvInject] = HookSpec(NAME, GATE, lambda opts: GPUEnvInject())
