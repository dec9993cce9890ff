"""The NRT planner: the NRT worked example (docs/reporting.md, "Share pools and reserved CPUs") from a
synthetic sysfs, merging with what the manager adds, change detection, pools and kubelet allocations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from koordqos.errors import ModelError
from koordqos.metrics.hardware import read_hardware
from koordqos.metrics.topology import read_topology
from koordqos.model.node import NodeInfo
from koordqos.model.pod import PodInfo
from koordqos.report.kubelet import (
    KubeletCPUManager,
    from_checkpoint,
    from_configz,
    parse_checkpoint,
)
from koordqos.report.nrt import NRTInputs, changed, desired, overlay, skeleton
from koordqos.testing.topofs import write_cpuinfo, write_topology

MODEL = "Intel(R) Xeon(R) Platinum 8369B CPU @ 2.70GHz"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"


def example_node(tmp_path: Path) -> tuple[Path, Path]:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    # 1 socket, 8 CPUs, SMT: cores {0,1},{2,3} on NUMA 0, {4,5},{6,7} on NUMA 1 (sysfs per-socket core ids)
    rows = [(cpu, cpu // 2, 0, cpu // 4) for cpu in range(8)]
    write_topology(sys_root, rows, {0: 16375892, 1: 16375892}, smt_active=True, no_turbo=False)
    write_cpuinfo(proc_root, MODEL, "GenuineIntel", 8)
    (proc_root / "meminfo").write_text("MemTotal: 32751784 kB\nMemFree: 1 kB\nMemAvailable: 1 kB\n")
    return sys_root, proc_root


def pod(name: str, qos: str, cpuset: str, phase: str = "Running", uid: str | None = None) -> PodInfo:
    return PodInfo(
        uid=uid or f"uid-{name}",
        namespace="default",
        name=name,
        labels={"koordinator.sh/qosClass": qos},
        annotations={RESOURCE_STATUS: json.dumps({"cpuset": cpuset})} if cpuset else {},
        phase=phase,
    )


def inputs(tmp_path: Path, pods: tuple[PodInfo, ...], **kw: Any) -> NRTInputs:
    sys_root, proc_root = example_node(tmp_path)
    node = NodeInfo(
        name="node-a", uid="4d1c", annotations={"node.koordinator.sh/reservation": '{"reservedCPUs":"0"}'}
    )
    return NRTInputs(
        node_name="node-a",
        node=node,
        topology=read_topology(sys_root),
        hardware=read_hardware(proc_root, sys_root),
        pods=pods,
        kubelet=kw.pop("kubelet", KubeletCPUManager(policy="none", source="config")),
        **kw,
    )


EXAMPLE_PODS = (pod("db", "LSR", "2-3"), pod("trader", "LSE", "6-7"))


def test_worked_example(tmp_path: Path) -> None:
    want = desired(inputs(tmp_path, EXAMPLE_PODS))
    obj = overlay(skeleton("node-a", "4d1c"), want)
    ann = obj["metadata"]["annotations"]
    detail = json.loads(ann["node.koordinator.sh/cpu-topology"])["detail"]
    assert detail == [{"id": i, "core": i // 2, "socket": 0, "node": i // 4} for i in range(8)]
    assert ann["node.koordinator.sh/cpu-shared-pools"] == (
        '[{"socket":0,"node":0,"cpuset":"1"},{"socket":0,"node":1,"cpuset":"4-5"}]'
    )
    assert ann["node.koordinator.sh/be-cpu-shared-pools"] == (
        '[{"socket":0,"node":0,"cpuset":"1-3"},{"socket":0,"node":1,"cpuset":"4-5"}]'
    )
    assert ann["kubelet.koordinator.sh/cpu-manager-policy"] == '{"policy":"none"}'
    assert ann["node.koordinator.sh/pod-cpu-allocs"] == "null"
    assert ann["node.koordinator.sh/reservation"] == '{"reservedCPUs":"0"}'
    assert ann["node.koordinator.sh/system-qos-resource"] == "{}"
    assert json.loads(ann["node.koordinator.sh/cpu-basic-info"]) == {
        "cpuModel": MODEL,
        "hyperThreadEnabled": True,
        "turboEnabled": True,
        "vendorID": "GenuineIntel",
    }
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "Koordinator"}
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "4d1c", "controller": True}
    ]
    assert obj["topologyPolicies"] == ["None"]
    zone0 = {
        "name": "node-0",
        "type": "Node",
        "resources": [
            {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"},
            {"name": "hugepages-1Gi", "capacity": "0", "allocatable": "0", "available": "0"},
            {"name": "hugepages-2Mi", "capacity": "0", "allocatable": "0", "available": "0"},
            {
                "name": "memory",
                "capacity": "16375892Ki",
                "allocatable": "16375892Ki",
                "available": "16375892Ki",
            },
        ],
    }
    assert obj["zones"][0] == zone0
    assert obj["zones"][1] == {**zone0, "name": "node-1"}
    assert not changed(obj, want)


def test_pd9_core_ids_are_unique_across_sockets(tmp_path: Path) -> None:
    rows = [(0, 0, 0, 0), (1, 0, 1, 0), (2, 1, 0, 0), (3, 1, 1, 0)]  # sysfs core ids repeat per socket
    write_topology(tmp_path, rows, {0: 1024})
    from koordqos.report.nrt import cpu_topology_annotation

    detail = json.loads(cpu_topology_annotation(read_topology(tmp_path)))["detail"]
    assert [(d["id"], d["core"], d["socket"]) for d in detail] == [(0, 0, 0), (1, 1, 1), (2, 2, 0), (3, 3, 1)]


def test_merge_keeps_what_the_manager_added(tmp_path: Path) -> None:
    want = desired(inputs(tmp_path, EXAMPLE_PODS))
    current = overlay(skeleton("node-a", "4d1c"), want)
    current["metadata"]["annotations"]["other.io/x"] = "keep"
    current["metadata"]["resourceVersion"] = "7"
    for zone in current["zones"]:
        zone["resources"].append(
            {
                "name": "kubernetes.io/batch-cpu",
                "capacity": "1000",
                "allocatable": "1000",
                "available": "1000",
            }
        )
    current["zones"].append({"name": "node-9", "type": "Node", "resources": []})
    assert changed(current, want)  # a zone that is no longer produced
    merged = overlay(current, want)
    assert [z["name"] for z in merged["zones"]] == ["node-0", "node-1"]
    assert all(any(r["name"] == "kubernetes.io/batch-cpu" for r in z["resources"]) for z in merged["zones"])
    assert merged["metadata"]["annotations"]["other.io/x"] == "keep"
    assert merged["metadata"]["resourceVersion"] == "7"
    assert not changed(merged, want)


def test_change_detection_is_semantic(tmp_path: Path) -> None:
    want = desired(inputs(tmp_path, EXAMPLE_PODS))
    obj = overlay(skeleton("node-a", "4d1c"), want)
    key = "node.koordinator.sh/cpu-basic-info"
    obj["metadata"]["annotations"][key] = json.dumps(
        json.loads(obj["metadata"]["annotations"][key]), indent=2
    )
    obj["zones"][0]["resources"][3]["capacity"] = str(16375892 * 1024)  # same value, other format
    assert not changed(obj, want)
    obj["metadata"]["annotations"]["node.koordinator.sh/cpu-shared-pools"] = "[]"
    assert changed(obj, want)
    fresh = desired(inputs(tmp_path / "2", (pod("db", "LSR", "2-3"),)))  # trader gone
    assert changed(overlay(skeleton("node-a", "4d1c"), want), fresh)


def test_terminal_and_invalid_pods_are_ignored(tmp_path: Path) -> None:
    bad = PodInfo(
        uid="u-bad", namespace="default", name="bad", annotations={RESOURCE_STATUS: '{"cpuset":"x-y"}'}
    )
    pods = (pod("done", "LSE", "1-3", phase="Succeeded"), bad)
    want = desired(inputs(tmp_path, pods))
    assert [p.cpuset for p in want.pools.ls] == ["1-3", "4-7"]  # only reserved CPU 0 is out
    assert want.problems
    assert "default/bad" in want.problems[0]


def test_static_kubelet_pins_come_out_of_both_pools(tmp_path: Path) -> None:
    state = parse_checkpoint(
        json.dumps(
            {
                "policyName": "static",
                "defaultCpuSet": "0-3,6-7",
                "entries": {"uid-kpod": {"main": "4-5"}, "uid-ls": {"c": "1"}, "uid-unknown": {"c": "7"}},
                "checksum": 1,
            }
        )
    )
    kubelet = KubeletCPUManager(policy="static", reserved_cpus="0", source="config")
    pods = (
        PodInfo(uid="uid-kpod", namespace="default", name="kpod"),
        pod("ls", "LS", "", uid="uid-ls"),  # Koordinator-managed: not a kubelet allocation
    )
    want = desired(inputs(tmp_path, pods, kubelet=kubelet, checkpoint=state))
    allocs = json.loads(want.annotations["node.koordinator.sh/pod-cpu-allocs"])
    assert allocs == [
        {
            "namespace": "default",
            "name": "kpod",
            "uid": "uid-kpod",
            "cpuset": "4-5",
            "managedByKubelet": True,
        },
        {"uid": "uid-unknown", "cpuset": "7", "managedByKubelet": True},
    ]
    assert (
        want.annotations["kubelet.koordinator.sh/cpu-manager-policy"]
        == '{"policy":"static","reservedCPUs":"0"}'
    )
    assert [p.cpuset for p in want.pools.be] == ["1-3", "6"]


def test_unknown_kubelet_leaves_kubelet_keys_alone(tmp_path: Path) -> None:
    want = desired(inputs(tmp_path, EXAMPLE_PODS, kubelet=None))
    assert "kubelet.koordinator.sh/cpu-manager-policy" not in want.annotations
    assert "node.koordinator.sh/pod-cpu-allocs" not in want.annotations
    current = skeleton("node-a", "4d1c")
    current["metadata"]["annotations"] = {"kubelet.koordinator.sh/cpu-manager-policy": '{"policy":"static"}'}
    merged = overlay(current, want)
    assert (
        merged["metadata"]["annotations"]["kubelet.koordinator.sh/cpu-manager-policy"]
        == '{"policy":"static"}'
    )


def test_kubelet_sources() -> None:
    cfg = from_configz(
        {
            "kubeletconfig": {
                "cpuManagerPolicy": "static",
                "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
                "reservedSystemCPUs": "1,0",
                "topologyManagerPolicy": "single-numa-node",
                "topologyManagerScope": "pod",
            }
        }
    )
    assert (cfg.policy, cfg.reserved_cpus, cfg.topology_policy) == ("static", "0-1", "SingleNUMANodePodLevel")
    assert dict(cfg.options) == {"full-pcpus-only": "true"}
    cp = from_checkpoint(parse_checkpoint('{"policyName":"none","defaultCpuSet":"","checksum":1}'))
    assert cp is not None
    assert cp.policy == "none"
    assert from_checkpoint(parse_checkpoint("{}")) is None
    with pytest.raises(ModelError):
        parse_checkpoint("not json")


def test_numa_mismatch_is_an_error(tmp_path: Path) -> None:
    inp = inputs(tmp_path, ())
    write_topology(tmp_path / "sys", [(c, c // 2, 0, 0) for c in range(8)], {0: 1, 1: 1})
    from dataclasses import replace

    with pytest.raises(ModelError, match="NUMA"):
        desired(replace(inp, topology=read_topology(tmp_path / "sys")))


def test_no_numa_information_gives_one_zone(tmp_path: Path) -> None:
    inp = inputs(tmp_path, ())
    from dataclasses import replace

    hw = replace(inp.hardware, numa={})
    want = desired(replace(inp, hardware=hw))
    assert [z["name"] for z in want.zones] == ["node-0"]
    cpu = next(r for r in want.zones[0]["resources"] if r["name"] == "cpu")
    mem = next(r for r in want.zones[0]["resources"] if r["name"] == "memory")
    assert cpu["capacity"] == "8"
    assert mem["capacity"] == "32751784Ki"


def test_numa_reservation_reduces_allocatable(tmp_path: Path) -> None:
    inp = inputs(tmp_path, ())
    from dataclasses import replace

    node = NodeInfo(
        name="node-a",
        labels={"node.koordinator.sh/enable-numa-reservation": "true"},
        capacity={"cpu": 8000, "memory": 32 << 30},
        allocatable={"cpu": 7000, "memory": 30 << 30},
    )
    want = desired(replace(inp, node=node))
    cpu = next(r for r in want.zones[0]["resources"] if r["name"] == "cpu")
    assert (cpu["capacity"], cpu["allocatable"], cpu["available"]) == ("4", "3500m", "3500m")
    assert want.labels["node.koordinator.sh/enable-numa-reservation"] == "true"


def test_cpu_basic_info_carries_the_l3_cat_mask(tmp_path: Path) -> None:
    """koordlet's `catL3CbmMask` (resctrl's info/L3/cbm_mask), in its field order; absent without L3 CAT."""
    inp = inputs(tmp_path, EXAMPLE_PODS)
    sys_root = tmp_path / "sys"
    mask = sys_root / "fs/resctrl/info/L3/cbm_mask"
    mask.parent.mkdir(parents=True)
    mask.write_text("7FF\n")
    from dataclasses import replace

    from koordqos.metrics.hardware import read_cat_l3_cbm_mask

    assert read_cat_l3_cbm_mask(sys_root) == "7ff"
    with_cat = replace(inp, hardware=read_hardware(tmp_path / "proc", sys_root))
    text = overlay(skeleton("node-a", "4d1c"), desired(with_cat))["metadata"]["annotations"][
        "node.koordinator.sh/cpu-basic-info"
    ]
    assert list(json.loads(text)) == [
        "cpuModel",
        "hyperThreadEnabled",
        "turboEnabled",
        "catL3CbmMask",
        "vendorID",
    ]
    assert json.loads(text)["catL3CbmMask"] == "7ff"
    mask.write_text("not hex\n")
    assert read_cat_l3_cbm_mask(sys_root) == ""
