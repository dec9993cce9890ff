"""A stand-in for nvidia-ml-py's `pynvml` module (no GPU here): the calls the agent makes, same names, same
return shapes (bytes or str UUIDs and names, a memory-info object with `.total`, `NVMLError` on failure).

`FakeNVML(gpus)` holds GPUs by PCI bus id; a GPU with `broken=True` raises `NVMLError` when asked about,
as a GPU that fell off the bus does. Test code passes `lambda: fake` as the agent's NVML loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    """pynvml's error type (its `value` is the NVML return code)."""

    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


NVML_ERROR_GPU_IS_LOST = 15


@dataclass
class FakeGPU:
    """One GPU as NVML would describe it."""

    uuid: str
    minor: int
    memory_total: int
    name: str = "NVIDIA A100-SXM4-80GB"
    broken: bool = False


@dataclass
class FakeNVML:
    """The module: GPUs by bus id, the driver version, and a count of init / shutdown calls."""

    gpus: dict[str, FakeGPU]
    driver: str = "535.129.03"
    inits: int = 0
    shutdowns: int = 0
    calls: list[str] = field(default_factory=list)
    NVMLError: type[NVMLError] = NVMLError

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def _gpu(self, handle: str) -> FakeGPU:
        gpu = self.gpus[handle]
        if gpu.broken:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST, "GPU is lost")
        return gpu

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> str:
        self.calls.append(f"handle {bus_id}")
        if bus_id not in self.gpus:
            raise NVMLError(6, "Not Found")
        return bus_id

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetMinorNumber(self, handle: str) -> int:
        return self._gpu(handle).minor

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        total = self._gpu(handle).memory_total
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return self._gpu(handle).name.encode()

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver
