"""The real koord-manager (Koordinator KOORDINATOR_VERSION, built from the Go module proxy) consumes what
koordqos reports, and its NodeSLO drives koordqos (issue #33 item 2): the drop-in claim against the real
control plane.

koord-manager runs against the suite's kube-apiserver with its slo-controller (nodemetric, nodeslo) and
noderesource controllers, leader election off and every webhook off (they need certificates, and nothing here
depends on them). Its configuration is the `slo-controller-config` ConfigMap, as in a Koordinator install.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from koordqos.model.cpuset import parse_cpuset
from koordqos.model.keys import MID_CPU, MID_MEMORY
from koordqos.model.pod import parse_pod
from koordqos.model.quantity import to_int
from koordqos.report.batch import BATCH_CPU, BATCH_MEMORY, BatchStrategy, ManagedPod, NodeCapacity, calculate
from koordqos.report.format import parse_rfc3339
from koordqos.report.mid import MidNode, MidPod, MidStrategy
from koordqos.report.mid import calculate as calculate_mid
from koordqos.testing.nodefs import GiB, SyntheticNode
from tests.support.agentproc import free_port

from .agentproc import running_agent
from .controlplane import KOORDINATOR_VERSION, ApiError, ControlPlane
from .koordinator import binary
from .kubeobjects import (
    NODEMETRIC_PATH,
    NODESLO_PATH,
    create_namespace,
    create_node,
    create_running_pod,
    eventually,
    try_get,
    unique,
)

pytestmark = [pytest.mark.e2e_apiserver, pytest.mark.e2e_koordinator]

KOORD_MANAGER = Path(os.environ.get("KOORDQOS_KOORD_MANAGER", str(binary("koord-manager"))))
MODE_ENV = "KOORDQOS_E2E_KOORDINATOR"  # "require" (nox -s e2e-koordinator): a missing build fails
CONFIG_NAMESPACE = "koordinator-system"
SUPPRESS_PERCENT = 45  # the cluster strategy koord-manager puts in every NodeSLO
COLOCATION = {
    "enable": True,
    "metricAggregateDurationSeconds": 60,
    "metricReportIntervalSeconds": 5,
    "cpuReclaimThresholdPercent": 60,
    "memoryReclaimThresholdPercent": 65,
    "degradeTimeMinutes": 1,
    "updateTimeThresholdSeconds": 10,
    "resourceDiffThreshold": 0.1,
    # the Mid tier (issue #34 item 6): half the unallocated resources on top of the reclaimable, capped at
    # 80 % of the node (the defaults, 0 % and 100 %, would hide both terms)
    "midUnallocatedPercent": 50,
    "midCPUThresholdPercent": 80,
    "midMemoryThresholdPercent": 80,
}
STRATEGY = BatchStrategy(
    cpu_reclaim_threshold_percent=60,
    memory_reclaim_threshold_percent=65,
    degrade_time_minutes=1,
    update_time_threshold_seconds=10,
)
MID_STRATEGY = MidStrategy(
    mid_cpu_threshold_percent=80,
    mid_memory_threshold_percent=80,
    mid_unallocated_percent=50,
    degrade_time_minutes=1,
    update_time_threshold_seconds=10,
)
#: the agent's prediction trains every second and takes the test's pods as warm (not "cold start"), so that
#: its prodReclaimableMetric holds a prediction within seconds instead of a day
PREDICTION_FLAGS = ("--prediction-cold-start-duration=0", "--prediction-training-interval=1s")


def _config_map(api: Any) -> None:
    try:
        create_namespace(api, CONFIG_NAMESPACE)
    except ApiError as exc:
        if exc.status != 409:
            raise
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "slo-controller-config", "namespace": CONFIG_NAMESPACE},
        "data": {
            "colocation-config": json.dumps(COLOCATION),
            "resource-threshold-config": json.dumps(
                {"clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": SUPPRESS_PERCENT}}
            ),
        },
    }
    try:
        api.create(f"/api/v1/namespaces/{CONFIG_NAMESPACE}/configmaps", body)
    except ApiError as exc:
        if exc.status != 409:
            raise


@pytest.fixture
def koord_manager(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Path]:
    if not KOORD_MANAGER.is_file():
        why = f"koord-manager {KOORDINATOR_VERSION} not built: `nox -s e2e-koordinator` builds it"
        if os.environ.get(MODE_ENV) == "require":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    _config_map(control_plane.api())
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "km-kubeconfig", control_plane.admin_token)
    log = tmp_path / "koord-manager.log"
    cmd = [
        str(KOORD_MANAGER),
        f"--kubeconfig={kubeconfig}",
        "--enable-leader-election=false",
        f"--metrics-addr=127.0.0.1:{free_port()}",
        f"--health-probe-addr=127.0.0.1:{free_port()}",
        "--controllers=noderesource,nodemetric,nodeslo",
        "--sync-period=5s",
        "--feature-gates=WebhookFramework=false,PodMutatingWebhook=false,PodValidatingWebhook=false,"
        "ElasticMutatingWebhook=false,ElasticValidatingWebhook=false",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield log
    finally:
        proc.kill()
        proc.wait()


def _batch(api: Any, node: str) -> tuple[int, int] | None:
    alloc = api.get(f"/api/v1/nodes/{node}").get("status", {}).get("allocatable", {})
    if BATCH_CPU not in alloc or BATCH_MEMORY not in alloc:
        return None
    return to_int(alloc[BATCH_CPU]), to_int(alloc[BATCH_MEMORY])


def _mid(api: Any, node: str) -> tuple[int, int] | None:
    alloc = api.get(f"/api/v1/nodes/{node}").get("status", {}).get("allocatable", {})
    if MID_CPU not in alloc or MID_MEMORY not in alloc:
        return None
    return to_int(alloc[MID_CPU]), to_int(alloc[MID_MEMORY])


def test_koord_manager_sets_batch_resources_from_koordqos_reports_and_drives_it_by_nodeslo(
    control_plane: ControlPlane, koord_manager: Path, tmp_path: Path
) -> None:
    api = control_plane.api()
    node_name, ns = unique("node"), unique("ns")
    create_namespace(api, ns)
    create_node(api, node_name, cpu="4", memory="16Gi")
    node = SyntheticNode(tmp_path / "node", cpus=4, memory_total=16 * GiB)
    web = create_running_pod(
        api, ns, "web", node_name, qos="LS", requests={"cpu": "1", "memory": "4Gi"}, priority=9500
    )
    batch = create_running_pod(api, ns, "batch", node_name, qos="BE", priority=5500)
    for pod, mem in ((web, 1 * GiB), (batch, 512 << 20)):  # anonymous pages: what the NodeMetric counts
        node.set_memory(node.add_pod(parse_pod(pod)), mem, anon=mem)
    # the node uses 1.75 GiB, 0.25 GiB of it outside the pods: the Prod tier's predicted memory peak (system +
    # Prod usage, with the margin) stays under its 4 GiB request, so that memory is reclaimable as well
    node.set_meminfo(16 * GiB, available=16 * GiB - 7 * GiB // 4, free=14 * GiB)
    status_path = f"{NODEMETRIC_PATH}/{node_name}"

    # koord-manager creates the node's NodeMetric (spec from colocation-config) and NodeSLO
    eventually(lambda: try_get(api, status_path) is not None, 60, "koord-manager creating the NodeMetric")
    eventually(lambda: try_get(api, f"{NODESLO_PATH}/{node_name}") is not None, 60, "its NodeSLO")
    spec = api.get(status_path)["spec"]["metricCollectPolicy"]
    assert spec["reportIntervalSeconds"] == COLOCATION["metricReportIntervalSeconds"]

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    flags = (*PREDICTION_FLAGS, f"--prediction-checkpoint-filepath={ckpt}")
    with running_agent(control_plane, node, node_name, tmp_path, *flags) as agent:
        # koordqos reports; koord-manager sets the batch resources from that report
        eventually(
            lambda: (api.get(status_path).get("status") or {}).get("updateTime") is not None,
            60,
            "koordqos's NodeMetric status",
        )
        eventually(lambda: _batch(api, node_name) is not None, 60, "koord-manager's batch-cpu/batch-memory")
        status = api.get(status_path)["status"]
        n = api.get(f"/api/v1/nodes/{node_name}")
        cap = {"cpu": 4000, "memory": 16 * GiB}
        pods = [
            ManagedPod(ns, "web", "koord-prod", "LS", {"cpu": 1000, "memory": 4 * GiB}),
            ManagedPod(ns, "batch", "koord-batch", "BE", {}),
        ]
        want = calculate(NodeCapacity(cap, cap), pods, status, STRATEGY)
        got = _batch(api, node_name)
        assert got == (want.batch_cpu, want.batch_memory), (got, want, status, n["status"]["allocatable"])
        assert want.batch_memory > 0

        # the Mid tier (issue #34 item 6): koord-manager's mid-cpu / mid-memory are its formula over the
        # prodReclaimableMetric koordqos reported (the LS pod's request less its predicted peak) and the
        # node's unallocated resources; polled because the prediction settles over its first samples and
        # koord-manager writes the Node again only after a 10 % change or updateTimeThresholdSeconds
        cap_node = MidNode(cap, cap)
        mid_pods = [
            MidPod("koord-prod", "Running", {"cpu": 1000, "memory": 4 * GiB}),
            MidPod("koord-batch", "Running", {}),
        ]
        seen: list[Any] = []

        def mid_matches() -> bool:
            status = api.get(status_path)["status"]
            reclaim = (status.get("prodReclaimableMetric") or {}).get("resource", {}).get("resources", {})
            expect = calculate_mid(cap_node, mid_pods, status, MID_STRATEGY)
            got = _mid(api, node_name)
            seen[:] = [got, expect, reclaim]
            return bool(reclaim) and got == (expect.mid_cpu, expect.mid_memory)

        eventually(mid_matches, 90, lambda: f"koord-manager's mid-cpu/mid-memory from the report {seen}")
        got_mid, expect_mid, _ = seen
        # both terms are in it: the reclaimable the prediction found (the LS pod uses 1 GiB of its 4 GiB
        # request and no CPU; the node 0.25 GiB besides) and half of the unallocated
        assert expect_mid.detail["reclaimable"]["memory"] > 0, expect_mid.detail
        assert expect_mid.detail["reclaimable"]["cpu"] > 0, expect_mid.detail
        assert got_mid[1] > expect_mid.detail["unallocated"]["memory"] * 50 // 100, expect_mid.detail

        # koord-manager's NodeSLO (its cluster strategy: cpuSuppressThresholdPercent 45, and Koordinator's
        # default policy cpuset) is what koordqos enforces: 45 % of 4 CPUs, nothing else busy, is 1.8 cores,
        # so the BE tier gets 2 CPUs, the quota untouched
        slo = api.get(f"{NODESLO_PATH}/{node_name}")["spec"]["resourceUsedThresholdWithBE"]
        assert slo["cpuSuppressThresholdPercent"] == SUPPRESS_PERCENT
        assert slo["cpuSuppressPolicy"] == "cpuset"
        be_qos = node.layout.qos_dirs()[2]
        cpus = lambda: parse_cpuset(node.read(be_qos, "cpuset", "cpuset.cpus"))  # noqa: E731
        eventually(lambda: len(cpus()) == 2, 30, "the BE tier's cpuset at 45 %")
        assert node.read(be_qos, "cpu", "cpu.cfs_quota_us") == "-1"
        assert agent.ready()

    # the agent is gone: its report goes stale, and at the next reconcile after degradeTimeMinutes (a Node
    # update: here the kubelet's heartbeat, which the test plays) koord-manager resets the batch resources,
    # i.e. removes them from the Node
    last = api.get(status_path)["status"]["updateTime"]
    stale_at = parse_rfc3339(last) + COLOCATION["degradeTimeMinutes"] * 60

    beat = [0.0]

    def heartbeat_until_reset() -> bool:
        if time.monotonic() - beat[0] >= 2.0:  # a heartbeat every 2 s, as a kubelet's node status updates
            heartbeat(api, node_name)
            beat[0] = time.monotonic()
        return _batch(api, node_name) is None

    eventually(heartbeat_until_reset, 150, "koord-manager resetting a stale report's batch resources")
    assert time.time() >= stale_at  # not before the report was stale
    alloc = api.get(f"/api/v1/nodes/{node_name}")["status"]["allocatable"]
    assert BATCH_CPU not in alloc
    assert BATCH_MEMORY not in alloc


def heartbeat(api: Any, node: str) -> None:
    """What the kubelet does every few seconds: the Ready condition's heartbeat time, through nodes/status."""
    n = api.get(f"/api/v1/nodes/{node}")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for cond in n["status"].get("conditions", []):
        cond["lastHeartbeatTime"] = now
    try:
        api.put(f"/api/v1/nodes/{node}/status", n)
    except ApiError as exc:
        if exc.status != 409:  # koord-manager wrote in between: the next heartbeat goes in
            raise
