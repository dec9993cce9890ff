"""GPUEnvInject and RDMADeviceInject (docs/devices.md, "GPUEnvInject" and "RDMADeviceInject"): koordlet's
cases, and the stage table (docs/behaviour-runtime-hooks.md, "Stages and hook order")."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from koordqos.errors import ModelError
from koordqos.hooks.context import ContainerContext, ContainerRequest, LinuxDevice, Mount, Stage
from koordqos.hooks.gpu import GPUEnvInject
from koordqos.hooks.options import HookOptions
from koordqos.hooks.rdma import RDMADeviceInject
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.model.devices import ANNOTATION_DEVICE_ALLOCATED, device_allocations

GI = 1 << 30


def ctx(alloc: object, labels: dict[str, str] | None = None, sandbox: bool = False) -> ContainerContext:
    ann = {ANNOTATION_DEVICE_ALLOCATED: alloc if isinstance(alloc, str) else json.dumps(alloc)}
    return ContainerContext(
        ContainerRequest(
            "pod-uid", "container-name", "containerd://abc", sandbox, "ns", "p", labels or {}, ann
        )
    )


def test_gpu_minors_become_nvidia_visible_devices() -> None:
    c = ctx({"gpu": [{"minor": 0}, {"minor": 1}]})
    GPUEnvInject().inject(c)
    assert c.response.add_envs == {"NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert c.response.add_mounts == []


def test_no_gpu_entry_no_env() -> None:
    c = ctx({"fpga": [{"minor": 0}]})
    GPUEnvInject().inject(c)
    assert c.response.add_envs == {}
    sandbox = ctx({"gpu": [{"minor": 0}]}, sandbox=True)
    GPUEnvInject().inject(sandbox)
    assert sandbox.response.add_envs == {}


def test_hami_core_limits_and_mounts() -> None:
    resources = {
        "koordinator.sh/gpu-core": "50",
        "koordinator.sh/gpu-memory": "16Gi",
        "koordinator.sh/gpu-memory-ratio": "50",
    }
    c = ctx(
        {"gpu": [{"minor": 1, "resources": resources}]},
        {"koordinator.sh/gpu-isolation-provider": "HAMi-core"},
    )
    GPUEnvInject().inject(c)
    assert c.response.add_envs == {
        "NVIDIA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_MEMORY_LIMIT": str(16 * GI),
        "CUDA_DEVICE_SM_LIMIT": "50",
        "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so",
    }
    assert c.response.add_mounts == [
        Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", "bind", ("rbind",)),
        Mount("/tmp/vgpulock", "/tmp/vgpulock", "bind", ("rbind",)),
    ]
    # a whole GPU (ratio 100): only the visible devices
    whole = ctx(
        {"gpu": [{"minor": 1, "resources": {"koordinator.sh/gpu-memory-ratio": "100"}}]},
        {"koordinator.sh/gpu-isolation-provider": "HAMi-core"},
    )
    GPUEnvInject().inject(whole)
    assert whole.response.add_envs == {"NVIDIA_VISIBLE_DEVICES": "1"}


def test_hami_core_without_ratio_or_memory_is_an_error() -> None:
    labels = {"koordinator.sh/gpu-isolation-provider": "HAMi-core"}
    with pytest.raises(ModelError, match="ratio"):
        GPUEnvInject().inject(ctx({"gpu": [{"minor": 0, "resources": {}}]}, labels))
    with pytest.raises(ModelError, match="memory"):
        GPUEnvInject().inject(
            ctx({"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-memory-ratio": 50}}]}, labels)
        )


@pytest.mark.parametrize(
    "bad", ["{", "[]", json.dumps({"gpu": {"minor": 0}}), json.dumps({"gpu": [{"minor": "0"}]})]
)
def test_a_malformed_allocation_is_an_error(bad: str) -> None:
    with pytest.raises(ModelError):
        GPUEnvInject().inject(ctx(bad))


def test_allocation_parsing() -> None:
    alloc = device_allocations(
        {
            ANNOTATION_DEVICE_ALLOCATED: json.dumps(
                {
                    "rdma": [
                        {
                            "minor": 1,
                            "id": "0000:1f:00.0",
                            "resources": {"koordinator.sh/rdma": "1"},
                            "extension": {"vfs": [{"minor": 0, "busID": "0000:1f:00.2"}]},
                        }
                    ]
                }
            )
        }
    )
    [dev] = alloc["rdma"]
    assert (dev.minor, dev.id, dev.resources, [v.bus_id for v in dev.vfs]) == (
        1,
        "0000:1f:00.0",
        {"koordinator.sh/rdma": 1},
        ["0000:1f:00.2"],
    )
    assert device_allocations({}) == {}


@pytest.fixture
def rdma_node(tmp_path: Path) -> tuple[Path, Path]:
    """A sys root with two PCI functions' uverbs and a dev root with real character device nodes."""
    if os.geteuid() != 0:
        pytest.skip("mknod of character device nodes needs root")
    sys_root, dev_root = tmp_path / "sys", tmp_path / "dev"
    (dev_root / "infiniband").mkdir(parents=True)
    for name, minor in (("rdma_cm", 255), ("uverbs0", 192), ("uverbs3", 195)):
        os.mknod(
            dev_root / "infiniband" / name,
            stat.S_IFCHR | 0o666,
            os.makedev(231 if name != "rdma_cm" else 10, minor),
        )
    for pci, uverbs in (("0000:1f:00.0", "uverbs0"), ("0000:1f:00.3", "uverbs3")):
        d = sys_root / "bus" / "pci" / "devices" / pci / "infiniband_verbs" / uverbs
        d.mkdir(parents=True)
    return sys_root, dev_root


def test_rdma_devices_of_the_pf_and_of_its_vfs(rdma_node: tuple[Path, Path]) -> None:
    hook = RDMADeviceInject(*rdma_node)
    pf = ctx({"rdma": [{"minor": 0, "id": "0000:1f:00.0"}]})
    hook.inject(pf)
    assert pf.response.add_devices == [
        LinuxDevice("/dev/infiniband/rdma_cm", 10, 255, "c", 0o666),
        LinuxDevice("/dev/infiniband/uverbs0", 231, 192, "c", 0o666),
    ]
    vf = ctx(
        {"rdma": [{"minor": 0, "id": "0000:1f:00.0", "extension": {"vfs": [{"busID": "0000:1f:00.3"}]}}]}
    )
    hook.inject(vf)
    assert [d.path for d in vf.response.add_devices] == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs3"]
    none = ctx({"gpu": [{"minor": 0}]})
    hook.inject(none)
    assert none.response.add_devices == []


def test_rdma_missing_or_hostile_devices_are_errors(rdma_node: tuple[Path, Path]) -> None:
    hook = RDMADeviceInject(*rdma_node)
    with pytest.raises(ModelError, match="no uverbs"):
        hook.inject(ctx({"rdma": [{"minor": 0, "id": "0000:2f:00.0"}]}))
    with pytest.raises(ModelError, match="not a PCI address"):
        hook.inject(ctx({"rdma": [{"minor": 0, "id": "../../../etc"}]}))
    (rdma_node[1] / "infiniband" / "rdma_cm").unlink()
    with pytest.raises(ModelError, match="rdma_cm"):
        hook.inject(ctx({"rdma": [{"minor": 0, "id": "0000:1f:00.0"}]}))


def test_gates_register_both_hooks_after_koordlets_upper_case_ones() -> None:
    off = RuntimeHooks(HookOptions(gates={}))
    assert "gpu env inject" not in off.names
    assert "rdma device inject" not in off.names
    on = RuntimeHooks(HookOptions(gates={"GPUEnvInject": True, "RDMADeviceInject": True}))
    names = [h.name for h in on.registry.hooks(Stage.PRE_CREATE_CONTAINER)]
    assert names[-2:] == ["gpu env inject", "rdma device inject"]
    assert names == sorted(names)
