"""The agent's configuration → the reporters' typed inputs (for the composer and `report --once`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from koordqos.bus import EventBus
from koordqos.config import AgentConfig
from koordqos.errors import KubeError
from koordqos.kube.client import KubeClient
from koordqos.kube.device import DeviceWriter
from koordqos.kube.reportwriters import NodeBatchPatcher, NodeMetricWriter, NRTWriter
from koordqos.metrics.hardware import read_hardware
from koordqos.metrics.topology import CpuTopology
from koordqos.prediction.checkpoint import CheckpointDir
from koordqos.prediction.model import PredictionParams
from koordqos.report.batchreporter import BatchCapacityReporter
from koordqos.report.devicereport import DeviceReporter
from koordqos.report.history import ReportHistory
from koordqos.report.kubelet import KubeletCPUManager, topology_policy
from koordqos.report.nodemetricreporter import NodeMetricReporter
from koordqos.report.nrt import NRTDesired
from koordqos.report.prediction import PredictionServer
from koordqos.report.record import ReportRecord
from koordqos.report.topologyreporter import KubeletSources, TopologyReporter

ClientSource = KubeClient | Callable[[], Awaitable[KubeClient]]


def explicit_kubelet(cfg: AgentConfig) -> KubeletCPUManager | None:
    """Kubelet source (1): the kubelet settings given to the agent, None when no policy is configured."""
    r = cfg.report
    if not r.kubelet_cpu_manager_policy:
        return None
    return KubeletCPUManager(
        policy=r.kubelet_cpu_manager_policy,
        options=dict(r.kubelet_cpu_manager_policy_options),
        reserved_cpus=r.kubelet_reserved_cpus if r.kubelet_cpu_manager_policy == "static" else "",
        topology_policy=topology_policy(r.kubelet_topology_manager_scope, r.kubelet_topology_manager_policy),
        source="config",
    )


def configz_fetcher(client: ClientSource, node_name: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    """Kubelet source (2): the kubelet's /configz through the API server's node proxy (`nodes/proxy` get)."""

    async def fetch() -> dict[str, Any]:
        c = client if isinstance(client, KubeClient) else await client()
        return await c.request("GET", f"/api/v1/nodes/{node_name}/proxy/configz", timeout=10.0)

    return fetch


def kubelet_sources(cfg: AgentConfig, client: ClientSource | None) -> KubeletSources:
    """All kubelet sources (docs/reporting.md) the configuration allows."""
    fetch = None
    if client is not None and not cfg.report.disable_query_kubelet_config:
        fetch = configz_fetcher(client, cfg.node_name)
    return KubeletSources(explicit_kubelet(cfg), fetch, cfg.report.kubelet_root)


def prediction_params(cfg: AgentConfig) -> PredictionParams:
    """The prediction group of the configuration as the models' parameters."""
    p = cfg.prediction
    return PredictionParams(
        cold_start_seconds=p.cold_start_seconds,
        safety_margin_percent=p.safety_margin_percent,
        memory_half_life_seconds=p.memory_half_life_seconds,
        cpu_half_life_seconds=p.cpu_half_life_seconds,
        training_interval_seconds=p.training_interval_seconds,
        model_expiration_seconds=p.model_expiration_seconds,
        checkpoint_interval_seconds=p.checkpoint_interval_seconds,
        checkpoint_max_per_step=p.checkpoint_max_per_step,
        max_models=p.max_models,
    )


def build_prediction(cfg: AgentConfig, bus: EventBus, history: ReportHistory) -> PredictionServer | None:
    """The prediction server of this configuration (None when `--enable-prediction=false`)."""
    p = cfg.prediction
    if not p.enabled:
        return None
    # a training window longer than the report's pod retention (the aggregate window) is kept whole
    history.min_pod_retention = p.training_interval_seconds + 2 * cfg.metrics.collect_interval_seconds
    history.configure(history.node_retention, history.pod_retention)
    checkpoints = CheckpointDir(p.checkpoint_dir, max_bytes=p.checkpoint_max_bytes)
    return PredictionServer(
        bus,
        history,
        prediction_params(cfg),
        checkpoints,
        delete_invalid=p.checkpoint_delete_invalid,
        read_only=cfg.dry_run,
    )


@dataclass
class Reporters:
    """The report components the composer runs, and what /debug/state shows of them."""

    nodemetric: NodeMetricReporter
    topology: TopologyReporter
    batch: BatchCapacityReporter | None = None
    device: DeviceReporter | None = None  # gate Accelerators
    prediction: PredictionServer | None = None

    @property
    def components(self) -> list[Any]:
        """Supervised components, in start order."""
        out: list[Any] = [self.nodemetric, self.topology]
        if self.prediction is not None:
            out.append(self.prediction)
        if self.batch is not None:
            out.append(self.batch)
        if self.device is not None:
            out.append(self.device)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The `report` entry of the agent status (/debug/state)."""
        return self.debug_state()

    def debug_state(self) -> dict[str, Any]:
        """The `report` section of /debug/state."""
        return {
            "nodeMetric": self.nodemetric.debug_state(),
            "nodeResourceTopology": self.topology.debug_state(),
            "batchResources": None if self.batch is None else _record(self.batch.last),
            "device": None if self.device is None else self.device.debug_state(),
            "prediction": None if self.prediction is None else self.prediction.debug_state(),
        }


def _record(record: ReportRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "builtAt": record.built_at,
        "outcome": record.outcome,
        "detail": record.detail,
        "writtenAt": record.written_at,
        "values": record.body,
    }


def build_reporters(
    cfg: AgentConfig,
    bus: EventBus,
    topology: CpuTopology,
    client: ClientSource | None,
    *,
    on_topology: Callable[[NRTDesired], None] | None = None,
) -> Reporters:
    """The reporters for this configuration; `client` None (local mode) computes without writing."""
    r = cfg.report
    paths = cfg.paths
    history = ReportHistory(cfg.metrics.collect_interval_seconds)
    nm_writer = None
    if client is not None and r.node_metric_enabled:
        nm_writer = NodeMetricWriter(client, cfg.node_name, min_write_interval=r.min_write_interval_seconds)
    prediction = build_prediction(cfg, bus, history)
    nodemetric = NodeMetricReporter(bus, history, nm_writer, prediction=prediction)
    threads = max((len(c) for c in topology.by_core().values()), default=1)
    nrt_writer = None
    if client is not None and cfg.gate("NodeTopologyReport"):
        nrt_writer = NRTWriter(client, cfg.node_name)
    nrt = TopologyReporter(
        bus,
        cfg.node_name,
        topology,
        read_hardware(paths.proc_root, paths.sys_root, threads),
        nrt_writer,
        kubelet=kubelet_sources(cfg, client),
        hugepage_report=cfg.gate("HugePageReport"),
        interval=r.node_topology_sync_interval_seconds,
        resync=r.node_topology_resync_seconds,
        on_topology=on_topology,
    )
    batch = None
    if client is not None and r.batch_resource_source == "agent":
        probe = NodeMetricWriter(client, cfg.node_name)

        async def manager_present() -> bool:
            try:
                return await probe.read() is not None
            except KubeError:
                return False  # unknown: keep going; the next round asks again

        batch = BatchCapacityReporter(
            bus, cfg.node_name, nodemetric, NodeBatchPatcher(client, cfg.node_name), manager_present
        )
    device = None
    if cfg.gate("Accelerators"):
        device = DeviceReporter(
            bus,
            cfg.node_name,
            paths.sys_root,
            r.xpu_device_infos_dir,
            None if client is None else DeviceWriter(client, cfg.node_name),
            xpu_only=r.xpu_enforce_collect_from_device_infos,
            report_empty=r.device_report_empty,
            interval=r.node_topology_sync_interval_seconds,
            resync=r.node_topology_resync_seconds,
        )
    return Reporters(nodemetric, nrt, batch, device, prediction)
