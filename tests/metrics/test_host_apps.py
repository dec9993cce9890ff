"""NodeSLO host applications: measured in their (confined) cgroups, stored by name, used by CPU suppress."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from koordqos.bus import EventBus
from koordqos.cgroups.executor import CgroupExecutor
from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.decisions import DecisionLog
from koordqos.errors import CgroupError, PathEscapeError
from koordqos.events.types import NodeSLOUpdated, NodeUpdated, PodUpserted
from koordqos.metrics.collector import MetricsCollector
from koordqos.metrics.hostapp import host_app_dir
from koordqos.metrics.store import MetricStore
from koordqos.metrics.telemetry import HOST_APP_REFUSED, MISSING
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import MetricKind
from koordqos.model.keys import LABEL_QOS
from koordqos.model.node import NodeInfo
from koordqos.model.nodeslo import CgroupPath, parse_nodeslo
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.strategies.cpusuppress import CPUSuppressStrategy
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.strategyenv import strategy_env

SEC = 1_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 7000.0

    def __call__(self) -> float:
        return self.now


def close(actual: float | None, expected: float) -> bool:
    """Within 1 % of the injected rate."""
    return actual is not None and abs(actual - expected) <= 0.01 * abs(expected)


def slo_with_apps(*apps: dict[str, Any], **threshold: Any) -> Any:
    spec: dict[str, Any] = {"hostApplications": list(apps)}
    if threshold:
        spec["resourceUsedThresholdWithBE"] = threshold
    return parse_nodeslo({"spec": spec})


def app(name: str, qos: str, base: str, relative: str, parent: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "qos": qos,
        "cgroupPath": {"base": base, "parentDir": parent, "relativePath": relative},
    }


def collector(node: SyntheticNode, bus: EventBus, clock: FakeClock) -> tuple[MetricsCollector, MetricStore]:
    store = MetricStore(retention_seconds=600, collect_interval=1.0, clock=clock)
    coll = MetricsCollector(
        bus,
        node.layout,
        CgroupReader(node.layout),
        store,
        proc_root=node.proc_root,
        topology=read_topology(node.sys_root),
        interval=1.0,
        clock=clock,
    )
    return coll, store


def refused(reason: str) -> float:
    return HOST_APP_REFUSED.labels(reason)._value.get()


@pytest.mark.parametrize(
    ("driver", "base", "expected"),
    [
        (CgroupDriver.CGROUPFS, "CgroupRoot", "host/nginx"),
        (CgroupDriver.CGROUPFS, "Kubepods", "kubepods/host/nginx"),
        (CgroupDriver.CGROUPFS, "KubepodsBurstable", "kubepods/burstable/host/nginx"),
        (CgroupDriver.SYSTEMD, "KubepodsBesteffort", "kubepods.slice/kubepods-besteffort.slice/host/nginx"),
    ],
)
def test_host_app_dir_joins_base_parent_and_relative(
    tmp_path: Path, driver: CgroupDriver, base: str, expected: str
) -> None:
    layout = CgroupLayout(tmp_path, CgroupVersion.V1, driver)
    path = CgroupPath.model_validate({"base": base, "parentDir": "/host/", "relativePath": "nginx/"})
    assert host_app_dir(layout, path) == expected


@pytest.mark.parametrize(
    ("parent", "relative"),
    [("", "../../etc"), ("a/../../..", "x"), ("ok", "x\x00y"), ("", ""), ("", "/")],
)
def test_host_app_dir_refuses_hostile_or_empty_paths(tmp_path: Path, parent: str, relative: str) -> None:
    layout = CgroupLayout(tmp_path)
    with pytest.raises(CgroupError):
        host_app_dir(layout, CgroupPath.model_validate({"parentDir": parent, "relativePath": relative}))


async def test_host_app_usage_collected_and_stored(node: SyntheticNode) -> None:
    bus = EventBus()
    clock = FakeClock()
    coll, store = collector(node, bus, clock)
    ls_app = app("nginx", "LS", "CgroupRoot", "nginx", parent="host-latency-sensitive")
    be_app = app("spark", "BE", "KubepodsBesteffort", "spark")
    await bus.publish(NodeSLOUpdated(slo_with_apps(ls_app, be_app)))
    ls_dir = "host-latency-sensitive/nginx"
    be_dir = f"{node.layout.qos_dir(KubeQoS.BESTEFFORT)}/spark"
    node.make_cgroup(ls_dir)
    node.make_cgroup(be_dir)

    first = await coll.round()
    assert first.host_apps["nginx"].cpu_usage_cores is None  # no delta yet
    assert first.host_apps["nginx"].dir == ls_dir

    dt = 2.0
    clock.now += dt
    node.add_cpu_usage(ls_dir, int(1.25 * dt * SEC))
    node.add_cpu_usage(be_dir, int(0.4 * dt * SEC))
    node.set_memory(ls_dir, 900 << 20, inactive_file=100 << 20)
    snap = await coll.round()
    assert close(snap.host_apps["nginx"].cpu_usage_cores, 1.25)
    assert close(snap.host_apps["spark"].cpu_usage_cores, 0.4)
    assert snap.host_apps["nginx"].memory_working_set == 800 << 20
    assert close(store.last(MetricKind.HOST_APP_CPU_USAGE, "nginx"), 1.25)
    assert close(store.last(MetricKind.HOST_APP_CPU_USAGE, "spark"), 0.4)
    assert store.last(MetricKind.HOST_APP_MEMORY_USAGE, "nginx") == 800 << 20

    # an app dropped from the NodeSLO loses its series
    await bus.publish(NodeSLOUpdated(slo_with_apps(be_app)))
    clock.now += 1
    snap = await coll.round()
    assert set(snap.host_apps) == {"spark"}
    assert store.keys(MetricKind.HOST_APP_CPU_USAGE) == ["spark"]


async def test_hostile_host_app_paths_refused_logged_once_counted(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpuacct.usage").write_text("123\n")
    os.symlink(outside, node.cgroup_root / "cpuacct" / "evil")  # escapes the cgroup root
    node.make_cgroup("good")
    bus = EventBus()
    clock = FakeClock()
    coll, store = collector(node, bus, clock)
    apps = [
        app("dotdot", "LS", "CgroupRoot", "../../../etc"),
        app("symlink", "LS", "CgroupRoot", "evil"),
        app("good", "LS", "CgroupRoot", "good"),
        {"name": "nopath", "qos": "LS"},
        app("gone", "LS", "CgroupRoot", "not-there"),
    ]
    await bus.publish(NodeSLOUpdated(slo_with_apps(*apps)))
    escape0, missing0 = refused("escape"), MISSING.labels("host_app_cgroup")._value.get()
    with capture_logs() as logs:
        snap = await coll.round()
        assert set(snap.host_apps) == {"good"}
        assert refused("escape") == escape0 + 2
        assert MISSING.labels("host_app_cgroup")._value.get() == missing0 + 1
        clock.now += 1
        node.add_cpu_usage("good", SEC)
        snap = await coll.round()
    assert set(snap.host_apps) == {"good"}
    assert close(snap.host_apps["good"].cpu_usage_cores, 1.0)
    assert refused("escape") == escape0 + 4  # counted every round…
    refusals = [e["app"] for e in logs if e["event"] == "host application cgroupPath refused; not measured"]
    assert sorted(refusals) == ["dotdot", "symlink"]  # …logged once per app
    assert store.keys(MetricKind.HOST_APP_CPU_USAGE) == ["good"]
    with pytest.raises(PathEscapeError):
        host_app_dir(node.layout, CgroupPath.model_validate({"relativePath": "evil"}))


async def test_cpu_suppress_live_path_counts_non_be_host_app(tmp_path: Path) -> None:
    """Collector → MetricStore → CPU suppress inputs → plan → executor, with an LS and a BE host app."""
    node = SyntheticNode(tmp_path, cpus=8)
    bus = EventBus()
    clock = FakeClock()
    coll, store = collector(node, bus, clock)
    lay = node.layout
    ls_pod = PodInfo(uid="ls-1", name="ls", namespace="ns", kube_qos=KubeQoS.BURSTABLE)
    be_pod = PodInfo(
        uid="be-1", name="be", namespace="ns", kube_qos=KubeQoS.BESTEFFORT, labels={LABEL_QOS: "BE"}
    )
    for pod in (ls_pod, be_pod):
        node.add_pod(pod)
        await bus.publish(PodUpserted(pod))
    # 1 core of the 8 is reserved by the kubelet: the system usage floor
    await bus.publish(
        NodeUpdated(NodeInfo(name="n", capacity={"cpu": 8000}, allocatable={"cpu": 7000}, source="procfs"))
    )
    apps = (app("nginx", "LS", "CgroupRoot", "nginx", "host"), app("etl", "BE", "KubepodsBesteffort", "etl"))
    slo = slo_with_apps(*apps, enable=True, cpuSuppressThresholdPercent=65, cpuSuppressPolicy="cfsQuota")
    await bus.publish(NodeSLOUpdated(slo))
    etl = f"{lay.qos_dir(KubeQoS.BESTEFFORT)}/etl"
    node.make_cgroup("host/nginx")
    node.make_cgroup(etl)
    await coll.round()

    dt = 2.0
    clock.now += dt
    usage = {lay.pod_dir(ls_pod): 1.0, lay.pod_dir(be_pod): 0.3, "host/nginx": 1.5, etl: 0.5}
    for rel, cores in usage.items():
        node.add_cpu_usage(rel, int(cores * dt * SEC))
    busy = sum(usage.values()) + 0.2  # + 0.2 cores of system usage
    node.advance_node_cpu(round(busy * dt * 100), round((8 - busy) * dt * 100))
    await coll.round()
    assert close(store.last(MetricKind.HOST_APP_CPU_USAGE, "nginx"), 1.5)

    decisions = DecisionLog()
    config = build_config({"paths": {"cgroup_root": str(node.cgroup_root)}})
    env = strategy_env(
        lay,
        decisions,
        config=config,
        store=store,
        reader=coll.reader,
        executor=CgroupExecutor(lay, decisions),
        topology=read_topology(node.sys_root),
    )
    strategy = CPUSuppressStrategy()
    await strategy.run_once(bus.state, env)
    plan = strategy.last_plan
    assert plan is not None
    assert not plan.skipped
    # 8000×65 % − LS pod 1000 − LS host app 1500 − system max(3.5 − 1.3 − 2.0, reserved 1.0) × 1000;
    # without the host-app series it would be 5200 − 1000 − 2200 = 2000
    assert plan.suppress_milli == 1700
    be_dir = lay.qos_dir(KubeQoS.BESTEFFORT)
    assert node.read(be_dir, "cpu", "cpu.cfs_quota_us") == "170000"
