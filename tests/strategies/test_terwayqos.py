"""TerwayQoS (docs/network-qos.md, "terway-qos"): the two files terway reads, their values, and their
removal."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from koordqos.config import AgentConfig, QoSSettings
from koordqos.decisions import DecisionLog
from koordqos.host.terway import GLOBAL_CONFIG, POD_CONFIG, TerwayFiles
from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.pod import PodInfo, parse_pod
from koordqos.state import NodeState
from koordqos.strategies.terwayqos import TerwayQoSStrategy, global_config, plan_terway
from koordqos.testing.nodefs import SyntheticNode
from koordqos.testing.strategyenv import strategy_env
from tests.support.fake_objects import make_pod

ANN = "koordinator.sh/networkQOS"


def slo(policy: str | None = "terway-qos", total: Any = "1000M", ls: Any = None, be: Any = None) -> Any:
    rqs: dict[str, Any] = {"policies": {"netQOSPolicy": policy}} if policy else {}
    if ls is not None:
        rqs["lsClass"] = {"networkQOS": ls}
    if be is not None:
        rqs["beClass"] = {"networkQOS": be}
    spec = {"systemStrategy": {"totalNetworkBandwidth": total}, "resourceQOSStrategy": rqs}
    return parse_nodeslo({"spec": spec})


def lines(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def pod(name: str, qos: str | None, kube: str | None = None, **ann: str) -> PodInfo:
    raw = make_pod(name, "n1", namespace="ns", qos=qos, uid=f"uid-{name}", annotations=dict(ann))
    if kube:
        raw["status"]["qosClass"] = kube
    return parse_pod(raw)


def test_global_config_in_bytes_per_second() -> None:
    text = global_config(
        slo(
            ls={
                "enable": True,
                "ingressRequest": 10,
                "ingressLimit": 100,
                "egressRequest": "100M",
                "egressLimit": 50,
            },
            be={
                "enable": True,
                "ingressRequest": 0,
                "ingressLimit": 20,
                "egressRequest": 0,
                "egressLimit": "200M",
            },
        )
    )
    assert list(lines(text)) == [
        "hw_tx_bps_max",
        "hw_rx_bps_max",
        "offline_l1_tx_bps_min",
        "offline_l1_tx_bps_max",
        "offline_l1_rx_bps_min",
        "offline_l1_rx_bps_max",
        "offline_l2_tx_bps_min",
        "offline_l2_tx_bps_max",
        "offline_l2_rx_bps_min",
        "offline_l2_rx_bps_max",
    ]
    assert lines(text) == {
        "hw_tx_bps_max": 125_000_000,
        "hw_rx_bps_max": 125_000_000,
        "offline_l1_tx_bps_min": 12_500_000,  # "100M" bits
        "offline_l1_tx_bps_max": 62_500_000,  # 50 %
        "offline_l1_rx_bps_min": 12_500_000,  # 10 %
        "offline_l1_rx_bps_max": 125_000_000,
        "offline_l2_tx_bps_min": 0,
        "offline_l2_tx_bps_max": 25_000_000,
        "offline_l2_rx_bps_min": 0,
        "offline_l2_rx_bps_max": 25_000_000,
    }
    # koordlet's units: a percentage of the total in bits, written as bytes
    koord = lines(global_config(slo(be={"enable": True, "egressLimit": 20}), koordlet_units=True))
    assert koord["offline_l2_tx_bps_max"] == 200_000_000


def test_a_disabled_class_is_zero_and_a_quantity_above_the_total_is_refused() -> None:
    assert lines(global_config(slo(ls={"enable": False, "egressLimit": 50})))["offline_l1_tx_bps_max"] == 0
    plan = plan_terway(slo(be={"enable": True, "egressLimit": "2G"}), {}, {})
    assert GLOBAL_CONFIG not in plan.files  # left as it was
    assert "larger than the total" in plan.problems["networkQOS"]
    assert plan.files[POD_CONFIG] == "{}"


def test_pod_json_entries_and_priorities() -> None:
    pods = [
        pod("sys", "SYSTEM"),
        pod("ls", "LS", **{ANN: json.dumps({"ingressLimit": "8M", "egressLimit": "16M"})}),
        pod("be", "BE"),
        pod("guar", None, "Guaranteed"),
        pod("bestef", None, "BestEffort"),
        pod("bad", "BE", **{ANN: "{"}),
    ]
    dirs = {p.uid: f"kubepods/pod{p.uid}" for p in pods}
    plan = plan_terway(slo(), {p.uid: p for p in pods}, dirs)
    doc = json.loads(plan.files[POD_CONFIG] or "")
    assert set(doc) == {"uid-sys", "uid-ls", "uid-be", "uid-guar", "uid-bestef"}  # the malformed one left out
    assert "pod:uid-bad" in plan.problems
    assert doc["uid-ls"] == {
        "podName": "ls",
        "podNamespace": "ns",
        "podUID": "uid-ls",
        "prio": 1,
        "cgroupDir": "/sys/fs/cgroup/net_cls/kubepods/poduid-ls",
        "qosConfig": {"ingressBandwidth": 1_000_000, "egressBandwidth": 2_000_000},
    }
    assert {u: e["prio"] for u, e in doc.items()} == {
        "uid-sys": 0,
        "uid-ls": 1,
        "uid-be": 2,
        "uid-guar": 1,
        "uid-bestef": 2,
    }


def test_another_policy_removes_both_and_no_nodeslo_does_nothing() -> None:
    assert plan_terway(slo("tc"), {}, {}).files == {GLOBAL_CONFIG: None, POD_CONFIG: None}
    assert plan_terway(slo(None), {}, {}).files == {GLOBAL_CONFIG: None, POD_CONFIG: None}  # default: tc
    assert plan_terway(None, {}, {}).files == {}


async def test_the_strategy_writes_and_removes_the_files(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    be = pod("be", "BE")
    node.add_pod(be)
    qos_dir = tmp_path / "terway" / "qos"
    config = AgentConfig(qos=QoSSettings(terway_qos_dir=qos_dir), feature_gates={"TerwayQoS": True})
    env = strategy_env(node.layout, config=config)
    strategy = TerwayQoSStrategy()
    assert strategy.enabled(config)
    assert not strategy.enabled(AgentConfig())
    await strategy.run_once(NodeState(pods={be.uid: be}, node_slo=slo()), env)
    assert lines((qos_dir / GLOBAL_CONFIG).read_text())["hw_tx_bps_max"] == 125_000_000
    doc = json.loads((qos_dir / POD_CONFIG).read_text())
    assert doc["uid-be"]["cgroupDir"] == f"/sys/fs/cgroup/net_cls/{node.layout.pod_dir(be)}"
    # unchanged: not rewritten
    mtime = os.stat(qos_dir / POD_CONFIG).st_mtime_ns
    await strategy.run_once(NodeState(pods={be.uid: be}, node_slo=slo()), env)
    assert os.stat(qos_dir / POD_CONFIG).st_mtime_ns == mtime
    # the pod leaves
    await strategy.run_once(NodeState(pods={}, node_slo=slo()), env)
    assert json.loads((qos_dir / POD_CONFIG).read_text()) == {}
    # another policy: both removed
    await strategy.run_once(NodeState(pods={}, node_slo=slo("tc")), env)
    assert sorted(os.listdir(qos_dir)) == []


async def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    qos_dir = tmp_path / "terway"
    config = AgentConfig(qos=QoSSettings(terway_qos_dir=qos_dir), feature_gates={"TerwayQoS": True})
    env = strategy_env(node.layout, DecisionLog(dry_run=True), config=config)
    await TerwayQoSStrategy().run_once(NodeState(pods={}, node_slo=slo()), env)
    assert not qos_dir.exists()
    assert env.decisions.recent(strategy="TerwayQoS")


def test_terway_files_refuse_a_symlinked_file(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    qos_dir = tmp_path / "qos"
    qos_dir.mkdir()
    (qos_dir / POD_CONFIG).symlink_to(target)
    out = TerwayFiles(qos_dir).sync({POD_CONFIG: "{}"})
    # refused, reported, and nothing written through the link
    assert "symbolic links" in out.errors[POD_CONFIG]
    assert target.read_text() == "keep"
    assert (qos_dir / POD_CONFIG).is_symlink()


def test_terway_dir_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "qos"
    path.write_text("not a dir")
    out = TerwayFiles(path).sync({POD_CONFIG: "{}"})
    assert POD_CONFIG in out.errors
