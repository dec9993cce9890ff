"""Demo scenarios for the mock runtime: pods of several QoS classes on a synthetic node directory.

`colocation`: a latency-sensitive web pod (LS), a pinned database (LSR, cpuset 0-1 from the scheduler's
resource-status) and a best-effort batch job with `kubernetes.io/batch-*` resources (BE), on a 4-CPU cgroup v1
node laid out by `koordqos.testing.nodefs` with a NodeSLO that enables CPU suppress and CPU QoS. The agent run
against it (the command `agent_command` prints) shows, in `/debug/decisions`, the hooks' per-pod decisions
(batch shares/quota/memory limit, group identity, cpuset) and the CPU suppress strategy's BE quota.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from koordqos.cgroups.resources import CgroupVersion
from koordqos.nri.api import nri_api_pb2 as api
from koordqos.testing.mock_nri.samples import sample_container, sample_pod
from koordqos.testing.nodefs import SyntheticNode

GiB = 1 << 30

NODESLO = """\
# NodeSLO of the colocation demo (local mode reads it with --nodeslo-file)
resourceUsedThresholdWithBE:
  enable: true
  cpuSuppressThresholdPercent: 65
  cpuSuppressPolicy: cfsQuota
resourceQOSStrategy:
  lsrClass: {cpuQOS: {enable: true}}
  lsClass: {cpuQOS: {enable: true}}
  beClass: {cpuQOS: {enable: true}}
"""


@dataclass
class Scenario:
    """What the mock runtime serves, and the synthetic node the agent runs against."""

    name: str
    pods: list[api.PodSandbox]
    containers: list[api.Container]
    node: SyntheticNode
    nodeslo_file: Path
    what_to_look_for: list[str] = field(default_factory=list)

    def agent_command(self, socket: str, http_addr: str = "127.0.0.1:9316") -> str:
        """The agent command line for this scenario (the venv's interpreter, as in the README)."""
        return (
            f".venv/bin/python -m koordqos run --nri-socket {socket} --cgroup-root {self.node.cgroup_root} "
            f"--proc-root {self.node.proc_root} --sys-root {self.node.sys_root} "
            f"--nodeslo-file {self.nodeslo_file} --http-addr {http_addr} --debug-endpoints "
            # the synthetic node has no resctrl mount and no kubelet to ask for its CPU manager policy
            "--feature-gates RdtResctrl=false --kubelet-cpu-manager-policy none"
        )


def _pod(
    i: int, name: str, kube_qos: str, labels: dict[str, str], annotations: dict[str, str]
) -> api.PodSandbox:
    pod = sample_pod(i, kube_qos)
    pod.name = name
    pod.labels["io.kubernetes.pod.name"] = name
    del pod.annotations["koordinator.sh/qosClass"]  # the QoS class is a label (koordlet reads labels)
    pod.labels.update(labels)
    pod.annotations.update(annotations)
    return pod


def _container(pod: api.PodSandbox, j: int, name: str, shares: int, quota: int, memory: int) -> api.Container:
    ctr = sample_container(pod, j)
    ctr.name = name
    ctr.labels["io.kubernetes.container.name"] = name
    res = ctr.linux.resources
    res.cpu.shares.value = shares
    res.cpu.quota.value = quota
    res.memory.limit.value = memory
    return ctr


def colocation(node_dir: Path) -> Scenario:
    """LS web, LSR database pinned to CPUs 0-1, BE batch job with batch resources; 4 CPUs, 16 GiB."""
    node = SyntheticNode(
        node_dir,
        CgroupVersion.V1,
        cpus=4,
        memory_total=16 * GiB,
        extensions=("cpu.bvt_warp_ns", "cpu.cfs_burst_us"),
    )
    web = _pod(1, "web", "burstable", {"koordinator.sh/qosClass": "LS"}, {})
    db = _pod(
        2,
        "db",
        "guaranteed",
        {"koordinator.sh/qosClass": "LSR"},
        {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0-1"})},
    )
    batch = _pod(
        3,
        "batch-job",
        "besteffort",
        {"koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-batch"},
        {
            "node.koordinator.sh/extended-resource-spec": json.dumps(
                {
                    "containers": {
                        "worker": {
                            "requests": {
                                "kubernetes.io/batch-cpu": "1000",
                                "kubernetes.io/batch-memory": "1Gi",
                            },
                            "limits": {
                                "kubernetes.io/batch-cpu": "2000",
                                "kubernetes.io/batch-memory": "2Gi",
                            },
                        }
                    }
                }
            )
        },
    )
    containers = [
        _container(web, 0, "nginx", 512, 100_000, 1 * GiB),  # requests 500m, limit 1 CPU / 1 GiB
        _container(db, 0, "postgres", 2048, 200_000, 4 * GiB),  # Guaranteed: 2 CPUs, 4 GiB
        _container(batch, 0, "worker", 2, -1, 0),  # BestEffort: no kube resources, batch ones instead
    ]
    for pod in (web, db, batch):
        node.make_cgroup(node.layout.normalize_parent(pod.linux.cgroup_parent))
    for ctr in containers:
        node.make_cgroup(node.layout.normalize_parent(ctr.linux.cgroups_path))
    nodeslo = Path(node_dir) / "nodeslo.yaml"
    nodeslo.write_text(NODESLO)
    return Scenario(
        "colocation",
        [web, db, batch],
        containers,
        node,
        nodeslo,
        [
            "Synchronize: batch-job/worker gets cpu.shares 1024 and a 2 GiB memory limit from its batch "
            "resources (no per-pod quota: with cpuSuppressPolicy cfsQuota the BE tier is capped as a whole)",
            "Synchronize: db/postgres (LSR) is pinned to cpus 0-1 by its resource-status annotation",
            "Synchronize: web/nginx (LS) gets the share pool, cpus 2-3 (the CPUs db does not hold)",
            "reconcile: cpu.bvt_warp_ns 2 for web (LS), db (LSR), their containers and QoS dirs, -1 for "
            "batch-job (BE)",
            "BECPUSuppress: kubepods/besteffort cpu.cfs_quota_us -1 -> 260000 (65 % of 4 CPUs on an idle "
            "node)",
        ],
    )


SCENARIOS: dict[str, Callable[[Path], Scenario]] = {"colocation": colocation}
