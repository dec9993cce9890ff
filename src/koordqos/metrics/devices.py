"""The node's accelerators, as koordlet's device collectors find them (gate `Accelerators`).

* **Device-info files** (`--xpu-device-infos-dir`, koordlet's `/var/run/koordlet/xpu-device-infos/`): each
  regular file is a JSON list of `{vendor, model, uuid, minor, resources, topology{p2pLinks,
  mustHonorPartition, socketID, nodeID, pcieID, busID}, status{healthy, errCode, errMessage}}`, written by a
  vendor's device plugin. An unreadable file is a problem (reported) and left out; the others still count
  (koordlet drops every device when one file is bad).
* **NVML** (`nvidia-ml-py`, the `pynvml` module, installed with `koordqos[gpu]`): only when the nvidia driver
  has bound a PCI device (`<sys>/bus/pci/drivers/nvidia/<pci address>`) is the library imported and
  initialised; each GPU's UUID, minor, memory, NUMA node and PCIe root (from sysfs), and one model and driver
  version for the node. A GPU NVML cannot be asked about is reported unhealthy with the NVML error (koordlet
  learns health from Xid events: not watched here, docs/devices.md).

Synchronous file and library calls: the reporter runs them in a worker thread.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PCI_ADDRESS = re.compile(r"^((1?[0-9a-f]{0,4}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f])$")
PCIE_ROOT = re.compile(r"pci\d{4}:[0-9a-fA-F]{2}")
MAX_FILE_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """A device's health as its source says."""

    healthy: bool
    err_code: str = ""
    err_message: str = ""


@dataclass(frozen=True, slots=True)
class XPUDevice:
    """One device of a device-info file (resources as quantity strings)."""

    vendor: str
    model: str
    uuid: str
    minor: str
    resources: Mapping[str, str] = field(default_factory=dict)
    node_id: str = ""
    pcie_id: str = ""
    bus_id: str = ""
    p2p_links: tuple[tuple[str, str], ...] = ()  # (peer minors "1,2", link type)
    must_honor_partition: bool = False
    status: DeviceStatus | None = None
    has_topology: bool = False


@dataclass(frozen=True, slots=True)
class GPUDevice:
    """One NVIDIA GPU as NVML and sysfs describe it."""

    uuid: str
    minor: int
    memory_total: int
    node_id: int
    pcie: str
    bus_id: str
    status: DeviceStatus | None = None


@dataclass
class DeviceScan:
    """What one scan found, and the problems (source → message) it met."""

    xpus: list[XPUDevice] = field(default_factory=list)
    gpus: list[GPUDevice] = field(default_factory=list)
    gpu_model: str = ""
    gpu_driver: str = ""
    problems: dict[str, str] = field(default_factory=dict)


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def parse_xpu_file(text: str) -> list[XPUDevice]:
    """A device-info file's devices; ValueError when it is not a JSON list of device objects."""
    doc = json.loads(text)
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise ValueError("expected a JSON list of devices")
    out = []
    for item in doc:
        if not isinstance(item, dict):
            raise ValueError("expected device objects")
        has_topology = isinstance(item.get("topology"), dict)
        topo = item.get("topology") or {}
        status = item.get("status")
        resources = item.get("resources") or {}
        if not isinstance(topo, dict) or not isinstance(resources, dict):
            raise ValueError("topology and resources must be objects")
        links = tuple(
            (_text(link.get("peerMinor")), _text(link.get("type")))
            for link in (topo.get("p2pLinks") or ())
            if isinstance(link, dict)
        )
        out.append(
            XPUDevice(
                vendor=_text(item.get("vendor")),
                model=_text(item.get("model")),
                uuid=_text(item.get("uuid")),
                minor=_text(item.get("minor")),
                resources={str(k): str(v) for k, v in resources.items()},
                node_id=_text(topo.get("nodeID")),
                pcie_id=_text(topo.get("pcieID")),
                bus_id=_text(topo.get("busID")),
                p2p_links=links,
                must_honor_partition=topo.get("mustHonorPartition") is True,
                status=None
                if not isinstance(status, dict)
                else DeviceStatus(
                    status.get("healthy") is True,
                    _text(status.get("errCode")),
                    _text(status.get("errMessage")),
                ),
                has_topology=has_topology,
            )
        )
    return out


def read_xpu_devices(directory: Path, scan: DeviceScan) -> None:
    """Every device-info file's devices into `scan` (a missing directory: none)."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return
    except OSError as exc:
        scan.problems[str(directory)] = exc.strerror or str(exc)
        return
    for name in names:
        path = directory / name
        try:
            if not path.is_file():
                continue
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            scan.xpus += parse_xpu_file(path.read_text())
        except (OSError, ValueError) as exc:
            scan.problems[str(path)] = str(exc)


def nvidia_pci_addresses(sys_root: Path) -> list[str]:
    """The PCI devices the nvidia driver has bound (koordlet's GetGPUDevicePCIBusIDs)."""
    try:
        names = os.listdir(sys_root / "bus" / "pci" / "drivers" / "nvidia")
    except OSError:
        return []
    return sorted(n.lower() for n in names if PCI_ADDRESS.match(n.lower()))


def pci_topology(sys_root: Path, bus_id: str) -> tuple[int, str]:
    """(NUMA node, PCIe root complex) of a PCI device; a node of -1 counts 0, as koordlet; OSError when the
    device is not in sysfs."""
    dev = sys_root / "bus" / "pci" / "devices" / bus_id
    raw = (dev / "numa_node").read_text().strip()
    node = int(raw) if raw.lstrip("-").isdigit() else 0
    m = PCIE_ROOT.search(os.path.realpath(dev))
    return max(node, 0), (m.group(0) if m else "")


NvmlLoader = Callable[[], Any]


def load_pynvml() -> Any:
    """The `pynvml` module of nvidia-ml-py (ImportError when it is not installed)."""
    return importlib.import_module("pynvml")


def read_nvml_gpus(sys_root: Path, scan: DeviceScan, loader: NvmlLoader = load_pynvml) -> None:
    """The GPUs, through NVML, into `scan` — only when the nvidia driver has bound a device."""
    addresses = nvidia_pci_addresses(sys_root)
    if not addresses:
        return
    try:
        nvml = loader()
    except ImportError as exc:
        scan.problems["nvml"] = f"GPUs present but nvidia-ml-py is not installed: {exc}"
        return
    try:
        nvml.nvmlInit()
    except Exception as exc:
        scan.problems["nvml"] = f"nvmlInit: {exc}"
        return
    try:
        models: list[str] = []
        for bus_id in addresses:
            try:
                node, pcie = pci_topology(sys_root, bus_id)
            except (OSError, ValueError) as exc:
                scan.problems[f"pci:{bus_id}"] = str(exc)
                node, pcie = -1, ""
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
                memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
                models.append(_decode(nvml.nvmlDeviceGetName(handle)))
            except Exception as exc:
                scan.problems[f"nvml:{bus_id}"] = str(exc)
                scan.gpus.append(
                    GPUDevice(bus_id, -1, 0, node, pcie, bus_id, DeviceStatus(False, "NVMLError", str(exc)))
                )
                continue
            scan.gpus.append(GPUDevice(_decode(uuid), minor, memory, node, pcie, bus_id, DeviceStatus(True)))
        if models and all(m and m == models[0] for m in models):
            scan.gpu_model = models[0].removeprefix("NVIDIA ").replace(" ", "-")
            try:
                scan.gpu_driver = _decode(nvml.nvmlSystemGetDriverVersion())
            except Exception as exc:
                scan.problems["nvml:driver"] = str(exc)
        elif models:
            scan.problems["nvml:model"] = f"GPU models differ or are empty: {models}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:
            scan.problems["nvml:shutdown"] = str(exc)


def _decode(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def scan_devices(
    sys_root: Path, xpu_dir: Path, *, xpu_only: bool = False, loader: NvmlLoader = load_pynvml
) -> DeviceScan:
    """Device-info files first; NVML only when they list no device (and `xpu_only` is off), as koordlet."""
    scan = DeviceScan()
    read_xpu_devices(xpu_dir, scan)
    if not scan.xpus and not xpu_only:
        read_nvml_gpus(sys_root, scan, loader)
    return scan
