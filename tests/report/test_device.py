"""The Device object: device-info files, NVML (a stand-in module: no GPU here), the object, the merge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from koordqos.metrics.devices import DeviceScan, nvidia_pci_addresses, read_xpu_devices, scan_devices
from koordqos.report.device import device_object, merge_device
from koordqos.testing.fake_nvml import FakeGPU, FakeNVML

NOW = "2026-12-07T10:00:00Z"
LATER = "2026-12-07T11:00:00Z"
GI = 1 << 30

XPUS = [
    {
        "vendor": "huawei",
        "model": "Ascend-910B",
        "uuid": "npu-b",
        "minor": "1",
        "resources": {"gpu-core": "100", "gpu-memory": "64Gi", "huawei.com/npu-cpu": "8"},
        "topology": {
            "nodeID": "1",
            "pcieID": "pci0000:80",
            "busID": "0000:81:00.0",
            "p2pLinks": [{"peerMinor": "0", "type": "HCCS"}],
        },
        "status": {"healthy": False, "errCode": "Xid79", "errMessage": "fell off the bus"},
    },
    {
        "vendor": "huawei",
        "model": "Ascend-910B",
        "uuid": "npu-a",
        "minor": "0",
        "resources": {"gpu-core": "100", "gpu-memory": "64Gi"},
        "topology": {
            "nodeID": "0",
            "pcieID": "pci0000:00",
            "busID": "0000:01:00.0",
            "p2pLinks": [{"peerMinor": "1", "type": "HCCS"}],
        },
        "status": {"healthy": True},
    },
]


def xpu_dir(tmp_path: Path, devices: list[dict[str, Any]] = XPUS) -> Path:
    d = tmp_path / "xpu-device-infos"
    d.mkdir(exist_ok=True)
    (d / "npu.json").write_text(json.dumps(devices))
    return d


def nvidia_sys(tmp_path: Path, gpus: dict[str, int]) -> Path:
    """A sys root where the nvidia driver has bound `gpus` (bus id → NUMA node) under PCIe root pci0000:3a."""
    sys_root = tmp_path / "sys"
    drv = sys_root / "bus" / "pci" / "drivers" / "nvidia"
    drv.mkdir(parents=True)
    (drv / "new_id").write_text("")  # the driver dir's other files are not devices
    for bus, numa in gpus.items():
        real = sys_root / "devices" / "pci0000:3a" / "0000:3a:00.0" / bus
        real.mkdir(parents=True)
        (real / "numa_node").write_text(f"{numa}\n")
        link = sys_root / "bus" / "pci" / "devices" / bus
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(real)
        (drv / bus).symlink_to(real)
    return sys_root


def test_device_info_files_make_the_device(tmp_path: Path) -> None:
    scan = scan_devices(tmp_path / "no-sys", xpu_dir(tmp_path), loader=lambda: None)
    obj, problems = device_object("n1", "node-uid", scan, NOW)
    assert problems == {}
    assert obj is not None
    meta = obj["metadata"]
    assert meta["name"] == "n1"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "n1",
            "uid": "node-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"] == {
        "node.koordinator.sh/gpu-model": "Ascend-910B",
        "node.koordinator.sh/gpu-vendor": "huawei",
        "node.koordinator.sh/gpu-partition-policy": "Prefer",
    }
    assert json.loads(meta["annotations"]["scheduling.koordinator.sh/gpu-partitions"]) == {
        "2": [{"minors": [0, 1], "gpuLinkType": "HCCS", "allocationScore": 1}]
    }
    a, b = obj["spec"]["devices"]
    assert a == {
        "id": "npu-a",
        "minor": 0,
        "type": "gpu",
        "health": True,
        "resources": {
            "koordinator.sh/gpu-memory-ratio": "100",
            "koordinator.sh/gpu-core": "100",
            "koordinator.sh/gpu-memory": "64Gi",
        },
        "topology": {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:00", "busID": "0000:01:00.0"},
        "conditions": [
            {
                "type": "Healthy",
                "status": "True",
                "lastTransitionTime": NOW,
                "reason": "DeviceHealthy",
                "message": "device is healthy",
            }
        ],
    }
    assert b["health"] is False
    assert b["resources"]["huawei.com/npu-cpu"] == "8"
    assert b["conditions"] == [
        {
            "type": "Healthy",
            "status": "False",
            "lastTransitionTime": NOW,
            "reason": "Xid79",
            "message": "fell off the bus",
        }
    ]


def test_a_node_without_devices_writes_none(tmp_path: Path) -> None:
    scan = scan_devices(tmp_path / "sys", tmp_path / "missing", loader=lambda: None)
    assert device_object("n1", "uid", scan, NOW) == (None, {})
    empty, _ = device_object("n1", "uid", scan, NOW, report_empty=True)  # koordlet's behaviour
    assert empty is not None
    assert empty["spec"] == {"devices": []}


def test_a_bad_file_is_a_problem_and_the_others_count(tmp_path: Path) -> None:
    d = xpu_dir(tmp_path)
    (d / "broken.json").write_text("{not json")
    (d / "notalist.json").write_text('{"uuid": "x"}')
    scan = DeviceScan()
    read_xpu_devices(d, scan)
    assert sorted(x.uuid for x in scan.xpus) == ["npu-a", "npu-b"]
    assert set(scan.problems) == {str(d / "broken.json"), str(d / "notalist.json")}


def test_nvml_is_asked_only_when_the_nvidia_driver_has_a_device(tmp_path: Path) -> None:
    asked: list[str] = []

    def loader() -> FakeNVML:
        asked.append("load")
        return FakeNVML({})

    scan_devices(tmp_path / "sys", tmp_path / "none", loader=loader)
    assert asked == []  # no GPU: the library is never imported
    assert nvidia_pci_addresses(nvidia_sys(tmp_path, {"0000:3b:00.0": 0})) == ["0000:3b:00.0"]


def test_nvml_gpus(tmp_path: Path) -> None:
    sys_root = nvidia_sys(tmp_path, {"0000:3b:00.0": 0, "0000:86:00.0": 1})
    fake = FakeNVML(
        {"0000:3b:00.0": FakeGPU("GPU-aaa", 0, 80 * GI), "0000:86:00.0": FakeGPU("GPU-bbb", 1, 80 * GI)}
    )
    scan = scan_devices(sys_root, tmp_path / "none", loader=lambda: fake)
    assert (fake.inits, fake.shutdowns) == (1, 1)
    obj, _ = device_object("n1", "uid", scan, NOW)
    assert obj is not None
    assert obj["metadata"]["labels"] == {
        "node.koordinator.sh/gpu-vendor": "nvidia",
        "node.koordinator.sh/gpu-model": "A100-SXM4-80GB",
        "node.koordinator.sh/gpu-driver-version": "535.129.03",
    }
    first, second = obj["spec"]["devices"]
    assert first["id"] == "GPU-aaa"
    assert first["minor"] == 0
    assert first["resources"] == {
        "koordinator.sh/gpu-core": "100",
        "koordinator.sh/gpu-memory": "80Gi",
        "koordinator.sh/gpu-memory-ratio": "100",
    }
    assert first["topology"] == {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:3a", "busID": "0000:3b:00.0"}
    assert second["topology"]["nodeID"] == 1
    assert first["conditions"][0]["status"] == "True"


def test_a_lost_gpu_is_unhealthy(tmp_path: Path) -> None:
    sys_root = nvidia_sys(tmp_path, {"0000:3b:00.0": 0, "0000:86:00.0": 0})
    fake = FakeNVML(
        {"0000:3b:00.0": FakeGPU("GPU-aaa", 0, GI), "0000:86:00.0": FakeGPU("GPU-bbb", 1, GI, broken=True)}
    )
    scan = scan_devices(sys_root, tmp_path / "none", loader=lambda: fake)
    obj, _ = device_object("n1", "uid", scan, NOW)
    assert obj is not None
    lost = [d for d in obj["spec"]["devices"] if not d["health"]]
    assert len(lost) == 1
    assert lost[0]["conditions"][0] | {"lastTransitionTime": ""} == {
        "type": "Healthy",
        "status": "False",
        "lastTransitionTime": "",
        "reason": "NVMLError",
        "message": "GPU is lost",
    }
    assert "nvml:0000:86:00.0" in scan.problems


def test_device_info_files_win_over_nvml(tmp_path: Path) -> None:
    sys_root = nvidia_sys(tmp_path, {"0000:3b:00.0": 0})
    fake = FakeNVML({"0000:3b:00.0": FakeGPU("GPU-aaa", 0, GI)})
    scan = scan_devices(sys_root, xpu_dir(tmp_path), loader=lambda: fake)
    assert fake.inits == 0
    assert scan.gpus == []
    assert len(scan.xpus) == 2
    only_files = scan_devices(sys_root, tmp_path / "none", xpu_only=True, loader=lambda: fake)
    assert only_files.gpus == []
    assert fake.inits == 0


def test_nvml_not_installed_is_a_problem(tmp_path: Path) -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    scan = scan_devices(nvidia_sys(tmp_path, {"0000:3b:00.0": 0}), tmp_path / "none", loader=missing)
    assert "nvidia-ml-py" in scan.problems["nvml"]
    assert scan.gpus == []


def test_merge_keeps_transition_times_and_says_unchanged(tmp_path: Path) -> None:
    scan = scan_devices(tmp_path / "sys", xpu_dir(tmp_path), loader=lambda: None)
    first, _ = device_object("n1", "uid", scan, NOW)
    assert first is not None
    stored = {**first, "metadata": {**first["metadata"], "resourceVersion": "7", "uid": "dev-uid"}}
    again, _ = device_object("n1", "uid", scan, LATER)
    assert again is not None
    assert merge_device(stored, again) is None  # only the times differ
    # npu-b recovers: its condition changes and gets the new time; npu-a keeps its old one
    healthy = [dict(x, status={"healthy": True}) for x in XPUS]
    changed, _ = device_object(
        "n1", "uid", scan_devices(tmp_path / "sys", xpu_dir(tmp_path, healthy), loader=lambda: None), LATER
    )
    assert changed is not None
    body = merge_device(stored, changed)
    assert body is not None
    assert body["metadata"]["resourceVersion"] == "7"
    times = {d["id"]: d["conditions"][0]["lastTransitionTime"] for d in body["spec"]["devices"]}
    assert times == {"npu-a": NOW, "npu-b": LATER}
    assert merge_device(None, changed) is changed


# -- the reporter against the fake API server --------------------------------------------------------------


async def test_the_reporter_creates_updates_and_empties_the_device(tmp_path: Path) -> None:
    from koordqos.bus import EventBus
    from koordqos.events.types import NodeUpdated
    from koordqos.kube.client import ClientConfig, KubeClient
    from koordqos.kube.device import DeviceWriter
    from koordqos.model.node import parse_node
    from koordqos.report.devicereport import DeviceReporter
    from tests.support.fake_apiserver import FakeAPIServer, make_node

    async def no_sleep(_: float) -> None:
        return None

    server = FakeAPIServer(token=None)
    await server.start()
    client = KubeClient(ClientConfig(host=server.url))
    try:
        bus = EventBus()
        d = xpu_dir(tmp_path)
        rep = DeviceReporter(
            bus, "n1", tmp_path / "sys", d, DeviceWriter(client, "n1", sleep=no_sleep), loader=lambda: None
        )
        assert await rep.round() == "waiting-for-node"  # no owner uid yet
        raw = make_node("n1")
        raw["metadata"]["uid"] = "node-uid-1"
        await bus.publish(NodeUpdated(parse_node(raw)))
        assert await rep.round() == "written"
        stored = server.get("devices", "n1", namespace="")
        assert stored is not None
        assert stored["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
        assert [x["id"] for x in stored["spec"]["devices"]] == ["npu-a", "npu-b"]
        assert await rep.round() == "unchanged"  # nothing new: no request
        # a device leaves: the object follows
        (d / "npu.json").write_text(json.dumps(XPUS[1:]))
        assert await rep.round() == "written"
        stored = server.get("devices", "n1", namespace="")
        assert stored is not None
        assert [x["id"] for x in stored["spec"]["devices"]] == ["npu-a"]
        # no device at all: the written Device is emptied, then nothing more is written
        (d / "npu.json").unlink()
        assert await rep.round() == "written"
        stored = server.get("devices", "n1", namespace="")
        assert stored is not None
        assert stored["spec"]["devices"] == []
        assert await rep.round() == "none"
    finally:
        await client.close()
        await server.stop()
