"""build_reporters: which writers exist for which configuration (local mode, gates, standalone)."""

from __future__ import annotations

from pathlib import Path

from koordqos.bus import EventBus
from koordqos.config import AgentConfig, build_config
from koordqos.kube.client import ClientConfig, KubeClient
from koordqos.metrics.topology import read_topology
from koordqos.report.build import build_reporters, explicit_kubelet
from koordqos.testing.nodefs import SyntheticNode


def _cfg(tmp: Path, **report: object) -> tuple[AgentConfig, SyntheticNode]:
    node = SyntheticNode(tmp / "node")
    tree = {
        "kube": {"node_name": "n1"},
        "paths": {
            "cgroup_root": str(node.cgroup_root),
            "proc_root": str(node.proc_root),
            "sys_root": str(node.sys_root),
        },
        "report": report,
    }
    return build_config(tree), node


def test_local_mode_computes_without_writers(tmp_path: Path) -> None:
    cfg, node = _cfg(tmp_path)
    r = build_reporters(cfg, EventBus(), read_topology(node.sys_root), None)
    assert r.nodemetric.writer is None
    assert r.topology.writer is None
    assert r.batch is None
    assert [c.name for c in r.components] == ["nodemetric-reporter", "nrt-reporter", "prediction"]
    assert r.prediction is not None
    assert r.nodemetric.prediction is r.prediction


def test_prediction_can_be_turned_off(tmp_path: Path) -> None:
    cfg, node = _cfg(tmp_path)
    cfg = cfg.model_copy(update={"prediction": cfg.prediction.model_copy(update={"enabled": False})})
    r = build_reporters(cfg, EventBus(), read_topology(node.sys_root), None)
    assert r.prediction is None
    assert r.nodemetric.prediction is None
    assert [c.name for c in r.components] == ["nodemetric-reporter", "nrt-reporter"]
    assert r.debug_state()["prediction"] is None


def test_cluster_mode_writers_follow_switches(tmp_path: Path) -> None:
    client = KubeClient(ClientConfig(host="http://127.0.0.1:1"))
    cfg, node = _cfg(tmp_path)
    r = build_reporters(cfg, EventBus(), read_topology(node.sys_root), client)
    assert r.nodemetric.writer is not None
    assert r.topology.writer is not None
    assert r.topology.kubelet.configz is not None
    cfg2, _ = _cfg(
        tmp_path / "b",
        node_metric_enabled=False,
        batch_resource_source="agent",
        disable_query_kubelet_config=True,
    )
    cfg2 = cfg2.model_copy(update={"feature_gates": {**cfg2.feature_gates, "NodeTopologyReport": False}})
    r2 = build_reporters(cfg2, EventBus(), read_topology(node.sys_root), client)
    assert r2.nodemetric.writer is None
    assert r2.topology.writer is None
    assert r2.topology.kubelet.configz is None
    assert r2.batch is not None
    assert r2.debug_state()["batchResources"] is None


def test_explicit_kubelet_config(tmp_path: Path) -> None:
    cfg, _ = _cfg(
        tmp_path,
        kubelet_cpu_manager_policy="static",
        kubelet_reserved_cpus="0-1",
        kubelet_cpu_manager_policy_options="full-pcpus-only=true",
        kubelet_topology_manager_policy="single-numa-node",
    )
    k = explicit_kubelet(cfg)
    assert k is not None
    assert (k.policy, k.reserved_cpus, k.topology_policy, k.source) == (
        "static",
        "0-1",
        "SingleNUMANodeContainerLevel",
        "config",
    )
    assert dict(k.options) == {"full-pcpus-only": "true"}
    none_cfg, _ = _cfg(tmp_path / "c")
    assert explicit_kubelet(none_cfg) is None


def test_dry_run_prediction_writes_no_checkpoints(tmp_path: Path) -> None:
    cfg, node = _cfg(tmp_path)
    r = build_reporters(
        cfg.model_copy(update={"dry_run": True}), EventBus(), read_topology(node.sys_root), None
    )
    assert r.prediction is not None
    assert r.prediction.read_only
    assert not build_reporters(cfg, EventBus(), read_topology(node.sys_root), None).prediction.read_only  # type: ignore[union-attr]


def test_a_long_training_window_keeps_the_pod_series_long_enough(tmp_path: Path) -> None:
    cfg, node = _cfg(tmp_path)
    cfg = cfg.model_copy(
        update={"prediction": cfg.prediction.model_copy(update={"training_interval_seconds": 900.0})}
    )
    r = build_reporters(cfg, EventBus(), read_topology(node.sys_root), None)
    assert r.nodemetric.history.pod_retention == 902.0
    r.nodemetric.set_policy(r.nodemetric.policy)  # a NodeMetric spec's retention (360 s) does not shorten it
    assert r.nodemetric.history.pod_retention == 902.0
    default, _ = _cfg(tmp_path / "d")
    assert (
        build_reporters(
            default, EventBus(), read_topology(node.sys_root), None
        ).nodemetric.history.pod_retention
        == 360.0
    )
