"""`python -m koordqos report --once` as a real subprocess: local mode on a synthetic node, and cluster mode
against the fake API server (prints both objects, writes nothing)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from koordqos.model.pod import parse_pod
from koordqos.testing.nodefs import GiB, SyntheticNode
from tests.support.agentproc import agent_env
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_nodemetric, make_pod

pytestmark = pytest.mark.e2e
NODE = "node-a"


async def run_cli(args: list[str], home: Path, timeout: float = 60.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "koordqos",
        *args,
        env=agent_env(home=home),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def roots(node: SyntheticNode) -> list[str]:
    return [
        *node.root_flags(),
        "--collect-interval",
        "0.2",
        "--node-name",
        NODE,
    ]


async def test_local_mode_prints_both_objects(tmp_path: Path) -> None:
    node = SyntheticNode(tmp_path / "node")
    code, out, err = await run_cli(["report", "--once", *roots(node)], tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["mode"] == "local"
    status = doc["nodeMetric"]["status"]
    assert status["nodeMetric"]["nodeUsage"]["resources"]["memory"] == "8Gi"  # MemTotal − MemAvailable
    nrt = doc["nodeResourceTopology"]["object"]
    assert nrt["metadata"]["name"] == NODE
    assert [z["name"] for z in nrt["zones"]] == ["node-0"]


async def test_cluster_mode_reads_the_cluster_and_writes_nothing(tmp_path: Path) -> None:
    fake = FakeAPIServer()
    await fake.start()
    try:
        node = SyntheticNode(tmp_path / "node")
        raw = make_pod("web-0", NODE, uid="u-web", requests={"cpu": "1", "memory": "1Gi"})
        fake.upsert("pods", raw)
        fake.upsert("nodes", make_node(NODE))
        spec = {"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": ["5m0s"]}}}
        fake.upsert("nodemetrics", make_nodemetric(NODE, spec))
        pod_dir = node.add_pod(parse_pod(raw))
        node.set_memory(pod_dir, 3 * GiB, inactive_file=GiB, anon=GiB + GiB // 2)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        args = [
            "report",
            "--once",
            "--kubeconfig",
            str(kubeconfig),
            "--batch-resource-source",
            "agent",
            *roots(node),
        ]
        code, out, err = await run_cli(args, tmp_path)
        assert code == 0, err
        doc: dict[str, Any] = json.loads(out)
        assert doc["mode"] == "cluster"
        assert doc["nodeMetric"]["exists"] is True
        status = doc["nodeMetric"]["status"]
        assert [a["duration"] for a in status["nodeMetric"]["aggregatedNodeUsages"]] == ["5m0s"]
        web = status["podsMetric"][0]
        assert (web["name"], web["qos"], web["priority"]) == ("web-0", "LS", "koord-prod")
        assert web["podUsage"]["resources"]["memory"] == "1536Mi"  # anon, not the 2 GiB working set
        assert doc["nodeResourceTopology"]["wouldWrite"] is True
        assert "kubernetes.io/batch-cpu" in doc["batchResources"]
        writes = fake.count_requests(lambda m, p, q: m in ("POST", "PUT", "PATCH", "DELETE"))
        assert writes == 0
        stored = fake.get("nodemetrics", NODE)
        assert stored is not None
        assert "status" not in stored
        assert fake.get("noderesourcetopologies", NODE) is None
    finally:
        await fake.stop()


def write_checkpoints(directory: Path, pod_uid: str) -> None:
    """Checkpoint files of 100 minutes of the worked example (docs/prediction.md, "Behaviour") (a steady prod
    pod of 1 core / 2 GiB, the system 0.3 core / 1 GiB), as the agent would have left them: `report --once`
    must predict from them at once."""
    from koordqos.prediction.checkpoint import encode
    from koordqos.prediction.model import ModelStore, PodUsage, RoundSamples, train

    store = ModelStore()
    now = int(time.time()) * 10**9
    for k in range(100):
        samples = RoundSamples([PodUsage(pod_uid, "koord-prod", 1.0, 2 * GiB)], 1.3, 3 * GiB)
        train(store, samples, now - (100 - k) * 60 * 10**9)
    directory.mkdir()
    for uid, model in store.models.items():
        (directory / uid).write_bytes(encode(uid, model.cpu.save(), model.memory.save(), now))


async def test_cluster_mode_predicts_from_the_checkpoints(tmp_path: Path) -> None:
    """The worked example's predictions from checkpoint files; numaUsages per NUMA node; the Mid values in
    standalone mode; the checkpoint directory left as it was."""
    fake = FakeAPIServer()
    await fake.start()
    try:
        node = SyntheticNode(tmp_path / "node")
        node.set_numa(0, [0, 1], {"MemTotal": 16 * GiB, "MemFree": 12 * GiB})
        node.set_numa(1, [2, 3], {"MemTotal": 16 * GiB, "MemFree": 14 * GiB})
        raw = make_pod("web-0", NODE, uid="u-web", requests={"cpu": "4", "memory": "8Gi"}, priority=9000)
        raw["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"  # past the 24 h cold start
        fake.upsert("pods", raw)
        fake.upsert("nodes", make_node(NODE, cpu="8", memory="32Gi"))
        fake.upsert("nodemetrics", make_nodemetric(NODE))
        pod_dir = node.add_pod(parse_pod(raw))
        node.set_memory(pod_dir, 2 * GiB, anon=2 * GiB)
        checkpoints = tmp_path / "checkpoints"
        write_checkpoints(checkpoints, "u-web")
        (checkpoints / "notes.txt").write_text("not a checkpoint\n")
        before = sorted((p.name, p.read_bytes()) for p in checkpoints.iterdir())
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        args = ["report", "--once", "--kubeconfig", str(kubeconfig), "--batch-resource-source", "agent"]
        args += ["--prediction-checkpoint-filepath", str(checkpoints), *roots(node)]
        code, out, err = await run_cli(args, tmp_path)
        assert code == 0, err
        doc: dict[str, Any] = json.loads(out)
        status = doc["nodeMetric"]["status"]
        assert status["prodReclaimableMetric"] == {
            "resource": {"resources": {"cpu": "2489m", "memory": "4998039436"}}
        }
        peak = {"resource": {"resources": {"cpu": "1511m", "memory": "3591895156"}}}
        assert status["prodPeakMetric"] == peak
        assert [n["numaNodeID"] for n in status["nodeMetric"]["numaUsages"]] == [0, 1]
        assert status["nodeMetric"]["numaUsages"][1]["nodeUsage"]["resources"]["memory"] == "2Gi"
        assert doc["prediction"]["restore"] == {"restored": 8, "deleted": 0, "skipped": 1, "error": ""}
        # Mid: min(R, unused) with R = 2489 m / 4998039436 B (the synthetic node uses far less)
        assert doc["midResources"] == {"kubernetes.io/mid-cpu": 2489, "kubernetes.io/mid-memory": 4998039436}
        assert sorted((p.name, p.read_bytes()) for p in checkpoints.iterdir()) == before
        assert fake.count_requests(lambda m, p, q: m in ("POST", "PUT", "PATCH", "DELETE")) == 0
    finally:
        await fake.stop()
