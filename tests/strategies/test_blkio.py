"""BlkioReconcile planner and local-storage discovery: the derived example (docs/reconcile.md, "Blkio" and
"Test coverage")."""

from __future__ import annotations

import json
from pathlib import Path

from koordqos.cgroups.resources import CgroupVersion, get_resource, render, same_value
from koordqos.metrics.localstorage import LocalStorage, parse_mounts, read_local_storage, split_dm_name
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.model.qos import KubeQoS
from koordqos.strategies.blkio import (
    COST_MODEL,
    COST_QOS,
    READ_BPS,
    READ_IOPS,
    WEIGHT,
    WRITE_BPS,
    WRITE_IOPS,
    BlkioInputs,
    plan_blkio,
    pod_volume_mount,
)

BE_DIR = "kubepods/besteffort"
UID = "pod-uid-1"
POD_DIR = f"kubepods/besteffort/pod{UID}"
MOUNT = pod_volume_mount("/var/lib/kubelet", UID, "pv-html")
STORAGE = LocalStorage(
    disk_number={"/dev/vda": "253:0", "/dev/vdb": "253:16"},
    partition_disk={"/dev/vda1": "/dev/vda"},
    vg_disk={"yoda-pool0": "/dev/vdb"},
    lv_vg={"/dev/mapper/yoda--pool0-pv--html": "yoda-pool0"},
    mount_device={MOUNT: "/dev/mapper/yoda--pool0-pv--html"},
)
USER_MODEL = {
    "enableUserModel": True,
    "modelReadBPS": 3324911720,
    "modelReadSeqIOPS": 168274,
    "modelReadRandIOPS": 352545,
    "modelWriteBPS": 2765819289,
    "modelWriteSeqIOPS": 367565,
    "modelWriteRandIOPS": 339390,
}
SLO = parse_nodeslo(
    {
        "spec": {
            "resourceQOSStrategy": {
                "beClass": {
                    "blkioQOS": {
                        "enable": True,
                        "blocks": [
                            {
                                "name": "yoda-pool0",
                                "type": "volumegroup",
                                "ioCfg": {
                                    "ioWeightPercent": 40,
                                    "readIOPS": 1024,
                                    "writeIOPS": 1024,
                                    "readBPS": 1048576,
                                    "writeBPS": 1048576,
                                },
                            }
                        ],
                    }
                },
                "cgroupRoot": {
                    "blkioQOS": {
                        "enable": True,
                        "blocks": [
                            {
                                "name": "/dev/vdb",
                                "type": "device",
                                "ioCfg": {
                                    "readLatency": 1000,
                                    "writeLatency": 1000,
                                    "readLatencyPercent": 90,
                                    "writeLatencyPercent": 90,
                                    **USER_MODEL,
                                },
                            }
                        ],
                    }
                },
            }
        }
    }
)


def _pod(annotation: str | None) -> PodInfo:
    raw = {
        "metadata": {
            "uid": UID,
            "name": "web",
            "namespace": "default",
            "labels": {"koordinator.sh/qosClass": "BE"},
            "annotations": {} if annotation is None else {"koordinator.sh/blkioQOS": annotation},
        },
        "spec": {
            "containers": [{"name": "c"}],
            "volumes": [{"name": "html", "persistentVolumeClaim": {"claimName": "html-claim"}}],
        },
        "status": {"phase": "Running", "qosClass": "BestEffort"},
    }
    return parse_pod(raw)


POD_ANNOTATION = json.dumps(
    {"blocks": [{"name": "html", "type": "podvolume", "ioCfg": {"readIOPS": 1024, "writeIOPS": 512}}]}
)
STALE = {(BE_DIR, r): "253:0 500\n" for r in (READ_IOPS, READ_BPS, WRITE_IOPS, WRITE_BPS)} | {
    (BE_DIR, WEIGHT): "default 100\n253:0 50\n",
    (
        "",
        COST_QOS,
    ): "253:0 enable=1 ctrl=user rpct=95.00 rlat=3000 wpct=95.00 wlat=3000 min=50.00 max=150.00\n",
}


def _inputs(pod: PodInfo, current: dict[tuple[str, str], str] | None = None) -> BlkioInputs:
    return BlkioInputs(
        SLO,
        STORAGE,
        {pod.uid: pod},
        BE_DIR,
        {UID: POD_DIR},
        current or {},
        pvc_volumes={("default", "html-claim"): "pv-html"},
    )


def _lines(plan_writes: list, parent: str) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(w.resource, w.value) for w in plan_writes if w.parent == parent]


def test_derived_example_exact_lines() -> None:
    plan = plan_blkio(_inputs(_pod(POD_ANNOTATION), STALE))
    assert plan.problems == {}
    assert _lines(plan.writes, BE_DIR) == [
        (READ_IOPS, "253:16 1024"),
        (READ_BPS, "253:16 1048576"),
        (WRITE_IOPS, "253:16 1024"),
        (WRITE_BPS, "253:16 1048576"),
        (WEIGHT, "253:16 40"),
        (READ_IOPS, "253:0 0"),
        (READ_BPS, "253:0 0"),
        (WRITE_IOPS, "253:0 0"),
        (WRITE_BPS, "253:0 0"),
        (WEIGHT, "253:0 100"),
    ]
    assert _lines(plan.writes, "") == [
        (COST_QOS, "253:16 enable=1 ctrl=user rpct=90 rlat=1000 wpct=90 wlat=1000"),
        (
            COST_MODEL,
            "253:16 ctrl=user rbps=3324911720 rseqiops=168274 rrandiops=352545 "
            "wbps=2765819289 wseqiops=367565 wrandiops=339390",
        ),
        (COST_QOS, "253:0 enable=0"),
    ]
    assert _lines(plan.writes, POD_DIR) == [
        (READ_IOPS, "253:16 1024"),
        (READ_BPS, "253:16 0"),
        (WRITE_IOPS, "253:16 512"),
        (WRITE_BPS, "253:16 0"),
        (WEIGHT, "253:16 100"),
    ]


def test_disabled_be_class_resets_every_entry() -> None:
    slo = parse_nodeslo(
        {"spec": {"resourceQOSStrategy": {"beClass": {"blkioQOS": {"enable": False, "blocks": []}}}}}
    )
    inp = BlkioInputs(slo, STORAGE, {}, BE_DIR, {}, STALE)
    plan = plan_blkio(inp)
    assert _lines(plan.writes, BE_DIR) == [
        (READ_IOPS, "253:0 0"),
        (READ_BPS, "253:0 0"),
        (WRITE_IOPS, "253:0 0"),
        (WRITE_BPS, "253:0 0"),
        (WEIGHT, "253:0 100"),
    ]
    # a nil enable counts as false (project decision): no panic, resets too
    nil = parse_nodeslo({"spec": {"resourceQOSStrategy": {"beClass": {"blkioQOS": {"blocks": []}}}}})
    assert _lines(plan_blkio(BlkioInputs(nil, STORAGE, {}, BE_DIR, {}, STALE)).writes, BE_DIR)


def test_empty_annotation_resets_the_pod_and_unresolvable_blocks_abort_the_target() -> None:
    current = {(POD_DIR, READ_IOPS): "253:16 1024\n"}
    plan = plan_blkio(_inputs(_pod(""), current))
    assert _lines(plan.writes, POD_DIR) == [(READ_IOPS, "253:16 0")]
    bad = json.dumps({"blocks": [{"name": "nope", "type": "podvolume", "ioCfg": {}}]})
    plan = plan_blkio(_inputs(_pod(bad), current))
    assert _lines(plan.writes, POD_DIR) == []
    assert "nope" in plan.problems["default/web"]
    plan = plan_blkio(_inputs(_pod("{not json"), current))
    assert _lines(plan.writes, POD_DIR) == []
    assert "default/web" in plan.problems


def test_pods_without_qos_label_or_not_running_are_skipped() -> None:
    pod = PodInfo(
        uid=UID, annotations={"koordinator.sh/blkioQOS": POD_ANNOTATION}, kube_qos=KubeQoS.BESTEFFORT
    )
    assert _lines(plan_blkio(_inputs(pod)).writes, POD_DIR) == []
    pending = _pod(POD_ANNOTATION).model_copy(update={"phase": "Pending"})
    assert _lines(plan_blkio(_inputs(pending)).writes, POD_DIR) == []


def test_device_partition_resolves_to_its_disk() -> None:
    slo = parse_nodeslo(
        {
            "spec": {
                "resourceQOSStrategy": {
                    "beClass": {
                        "blkioQOS": {
                            "enable": True,
                            "blocks": [{"name": "/dev/vda1", "type": "device", "ioCfg": {"readBPS": 10}}],
                        }
                    }
                }
            }
        }
    )
    plan = plan_blkio(BlkioInputs(slo, STORAGE, {}, BE_DIR, {}, {}))
    assert (READ_BPS, "253:0 10") in _lines(plan.writes, BE_DIR)


def test_per_device_comparison_and_v2_rendering() -> None:
    v1, v2 = CgroupVersion.V1, CgroupVersion.V2
    iops = get_resource(READ_IOPS)
    assert same_value(iops, v1, "253:0 5\n253:16 1024\n", "253:16 1024")
    assert not same_value(iops, v1, "253:0 1024\n", "253:16 1024")
    assert same_value(iops, v1, "", "253:16 0")  # absent = unlimited
    weight = get_resource(WEIGHT)
    assert same_value(weight, v1, "default 100\n", "253:16 100")
    assert render(iops, "253:16 1024", v2) == "253:16 riops=1024"
    assert render(get_resource(WRITE_BPS), "253:16 0", v2) == "253:16 wbps=max"
    assert same_value(iops, v2, "253:16 rbps=max wbps=max riops=1024 wiops=max\n", "253:16 riops=1024")
    assert same_value(iops, v2, "", "253:16 riops=max")
    qos = get_resource(COST_QOS)
    assert same_value(
        qos, v1, STALE[("", COST_QOS)], "253:0 enable=1 ctrl=user rpct=95 rlat=3000 wpct=95 wlat=3000"
    )
    assert get_resource(READ_IOPS).file(v2) == "io.max"
    assert weight.file(v2) == "io.weight"


def test_read_local_storage_from_sys_and_proc(tmp_path: Path) -> None:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    for disk, num in (("vda", "253:0"), ("vdb", "253:16")):
        (sys_root / "block" / disk).mkdir(parents=True)
        (sys_root / "block" / disk / "dev").write_text(num + "\n")
    (sys_root / "block/vda/vda1").mkdir()
    (sys_root / "block/vda/vda1/dev").write_text("253:1\n")
    dm = sys_root / "block/dm-0"
    (dm / "dm").mkdir(parents=True)
    (dm / "slaves/vdb").mkdir(parents=True)
    (dm / "dev").write_text("252:0\n")
    (dm / "dm/name").write_text("yoda--pool0-pv--html\n")
    proc_root.mkdir()
    (proc_root / "mounts").write_text(
        "/dev/vda / ext4 rw 0 0\n"
        f"/dev/mapper/yoda--pool0-pv--html {MOUNT} ext4 rw 0 0\n"
        "proc /proc proc rw 0 0\n"
    )
    storage = read_local_storage(sys_root, proc_root)
    assert storage.disk_number == {"/dev/vda": "253:0", "/dev/vdb": "253:16"}
    assert storage.partition_disk == {"/dev/vda1": "/dev/vda"}
    assert storage.vg_disk == {"yoda-pool0": "/dev/vdb"}
    assert storage.number_of_vg("yoda-pool0") == "253:16"
    assert storage.number_of_device(storage.mount_device[MOUNT]) == "253:16"
    assert storage.number_of_device("/dev/vda1") == "253:0"
    assert split_dm_name("a--b-c") == ("a-b", "c")
    assert split_dm_name("plain") is None
    assert parse_mounts("/dev/sda1 /mnt/my\\040disk ext4 rw 0 0\n") == {"/mnt/my disk": "/dev/sda1"}


def test_v2_weight_only_while_the_disks_cost_qos_is_on() -> None:
    """cgroup v2 refuses a disk's io.weight (EOPNOTSUPP) unless its io cost QoS is on (seen in the v2 VM:
    a failed write every round): without it the weight is not planned and a weight other than 100 is a
    problem; with the root switching it on in the same plan, that write comes first."""
    strategy = SLO.resource_qos_strategy
    assert strategy is not None
    assert strategy.be_class is not None
    be_class = strategy.be_class.model_dump(by_alias=True, exclude_none=True)
    be_only = parse_nodeslo({"spec": {"resourceQOSStrategy": {"beClass": be_class}}})
    plan = plan_blkio(BlkioInputs(be_only, STORAGE, {}, BE_DIR, {}, {}, weight_needs_cost_qos=True))
    assert [r for r, _ in _lines(plan.writes, BE_DIR)] == [READ_IOPS, READ_BPS, WRITE_IOPS, WRITE_BPS]
    assert list(plan.problems) == ["beClass:253:16"]
    assert "needs its io cost QoS on" in plan.problems["beClass:253:16"]
    # v1 plans the weight as before
    v1 = plan_blkio(BlkioInputs(be_only, STORAGE, {}, BE_DIR, {}, {}))
    assert (WEIGHT, "253:16 40") in _lines(v1.writes, BE_DIR)
    # the root configures 253:16's cost QoS: switched on first, then the BE weight
    plan = plan_blkio(BlkioInputs(SLO, STORAGE, {}, BE_DIR, {}, {}, weight_needs_cost_qos=True))
    assert plan.problems == {}
    order = [(w.parent, w.resource) for w in plan.writes]
    assert order.index(("", COST_QOS)) < order.index((BE_DIR, WEIGHT))
    # a disk whose cost QoS is switched off (253:0, on now) gets its weight reset before that
    plan = plan_blkio(BlkioInputs(SLO, STORAGE, {}, BE_DIR, {}, STALE, weight_needs_cost_qos=True))
    writes = [(w.parent, w.resource, w.value) for w in plan.writes]
    assert writes.index((BE_DIR, WEIGHT, "253:0 100")) < writes.index(("", COST_QOS, "253:0 enable=0"))
