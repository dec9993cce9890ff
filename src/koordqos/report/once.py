"""`python -m koordqos report --once`: collect a few rounds, print the NodeMetric status and the NRT the agent
would write (and the standalone batch and Mid values), as JSON. The prediction fields come from the
checkpoints in `--prediction-checkpoint-filepath` plus one training round over the collected rounds.
Writes nothing: no API writes, no cgroup writes, no checkpoint files."""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import Any

from koordqos.bus import EventBus
from koordqos.cgroups.layout import CgroupLayout
from koordqos.cgroups.reader import CgroupReader
from koordqos.config import AgentConfig
from koordqos.errors import ModelError
from koordqos.kube.client import ApiError, KubeClient
from koordqos.metrics.collector import MetricsCollector
from koordqos.metrics.hardware import read_hardware
from koordqos.metrics.store import MetricStore
from koordqos.metrics.topology import read_topology
from koordqos.metrics.types import ContainerSeries
from koordqos.model.node import parse_node
from koordqos.model.nodeslo_validate import validate_nodeslo
from koordqos.model.pod import parse_pod
from koordqos.report.batchreporter import standalone_mid_values, standalone_values
from koordqos.report.build import build_prediction, kubelet_sources
from koordqos.report.history import ReportHistory
from koordqos.report.nodemetric import StatusSkipped
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.report.nrt import modifier
from koordqos.report.policy import parse_collect_policy
from koordqos.report.topologyreporter import TopologyReporter
from koordqos.state import NodeState

Json = dict[str, Any]


async def _get(client: KubeClient, path: str) -> Json | None:
    try:
        return await client.request("GET", path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


async def _cluster_state(client: KubeClient, node: str) -> tuple[NodeState, Json | None, Json | None]:
    """Pods, Node and NodeSLO of this node, and the NodeMetric and NRT as they are in the cluster."""
    pods_doc = await client.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
    pods = {p.uid: p for p in (parse_pod(raw) for raw in pods_doc.get("items") or [])}
    node_doc = await _get(client, f"/api/v1/nodes/{node}")
    slo_doc = await _get(client, f"/apis/slo.koordinator.sh/v1alpha1/nodeslos/{node}")
    slo = None
    if slo_doc is not None:
        try:
            slo = validate_nodeslo(slo_doc).slo  # as the agent applies it: invalid fields at their defaults
        except ModelError:
            slo = None
    nodemetric = await _get(client, f"/apis/slo.koordinator.sh/v1alpha1/nodemetrics/{node}")
    nrt = await _get(client, f"/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies/{node}")
    state = NodeState(
        pods=MappingProxyType(pods), node=parse_node(node_doc) if node_doc is not None else None, node_slo=slo
    )
    return state, nodemetric, nrt


async def report_once(cfg: AgentConfig, cluster: bool, rounds: int = 3) -> Json:
    """Collect `rounds` metric rounds one collect interval apart, then plan both reports (cluster mode:
    with the node's pods, Node, NodeSLO, NodeMetric spec and NRT read from the API server)."""
    paths = cfg.paths
    node_name = cfg.node_name
    client: KubeClient | None = None
    state = NodeState()
    nodemetric: Json | None = None
    nrt: Json | None = None
    if cluster:
        from koordqos.kube import KubeConnection

        conn = KubeConnection(cfg.kube.kubeconfig)
        client = await conn.get()
    try:
        if client is not None:
            state, nodemetric, nrt = await _cluster_state(client, node_name)
        layout = CgroupLayout.detect(paths.cgroup_root, proc_root=paths.proc_root, sys_root=paths.sys_root)
        reader = CgroupReader(layout)
        topology = read_topology(paths.sys_root)
        threads = max((len(c) for c in topology.by_core().values()), default=1)
        bus = EventBus(state=state)
        interval = cfg.metrics.collect_interval_seconds
        collector = MetricsCollector(
            bus,
            layout,
            reader,
            MetricStore(60.0, interval),
            proc_root=paths.proc_root,
            sys_root=paths.sys_root,
            topology=topology,
            interval=interval,
            # the reports are made of pod, node and host-app series: no container file is read
            container_demand=lambda pod, state: ContainerSeries.NONE,
        )
        history = ReportHistory(interval)
        for i in range(max(rounds, 2)):  # CPU rates need two rounds
            if i:
                await asyncio.sleep(interval)
            history.ingest(await collector.collect())
        reader.close()
        # the models as the agent would have them now: its checkpoints (read, nothing deleted or written),
        # and one training round over what was just collected
        prediction = build_prediction(cfg, bus, history)
        if prediction is not None:
            await prediction.restore(state, read_only=True)
            await prediction.train_round(state)
        reporter = NodeMetricReporter(bus, history, None, prediction=prediction)
        spec = (nodemetric or {}).get("spec")
        reporter.set_policy(parse_collect_policy(spec if isinstance(spec, dict) else None))
        status = reporter.build()
        topo = TopologyReporter(
            bus,
            node_name,
            topology,
            read_hardware(paths.proc_root, paths.sys_root, threads),
            None,
            kubelet=kubelet_sources(cfg, client),
            hugepage_report=cfg.gate("HugePageReport"),
        )
        want = await topo.compute()
        out: Json = {
            "node": node_name,
            "mode": "cluster" if cluster else "local",
            "nodeMetric": {"exists": nodemetric is not None}
            | ({"skipped": status.reason} if isinstance(status, StatusSkipped) else {"status": status}),
        }
        if want is None:
            out["nodeResourceTopology"] = {"error": "node topology facts contradict each other (see the log)"}
        else:
            uid = state.node.uid if state.node is not None else ""
            body = modifier(want, node_name, uid)(nrt)
            out["nodeResourceTopology"] = {
                "wouldWrite": body is not None,
                "object": body if body is not None else nrt,
            }
        if prediction is not None:
            out["prediction"] = prediction.debug_state()
        if cfg.report.batch_resource_source == "agent" and not isinstance(status, StatusSkipped):
            values, why = standalone_values(state, status)
            out["batchResources"] = values if values is not None else {"skipped": why}
            mid, why = standalone_mid_values(state, status)
            out["midResources"] = mid if mid is not None else {"skipped": why}
        return out
    finally:
        if client is not None:
            await client.close()
