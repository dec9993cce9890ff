"""Local mode (NRI pods, NodeSLO file, procfs node) and the kube package plugged into a real Agent."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from koordqos import observability as obs
from koordqos.agent import Agent
from koordqos.config import build_config
from koordqos.errors import ConfigError
from koordqos.events.types import RuntimeSandbox, RuntimeSandboxRemoved, RuntimeSandboxUpserted
from koordqos.kube.evictor import Evictor
from koordqos.localsources import LocalSources, kube_qos_from_cgroup_parent, read_node_from_procfs
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.testing.poll import wait_until
from tests.support.fake_apiserver import FakeAPIServer, make_node, make_pod

from .conftest import NODE


def proc_root(tmp_path: Path, cpus: int = 4, mem_kb: int = 8 * 1024 * 1024) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    lines = ["cpu  1 2 3 4 5 6 7 0 0 0"] + [f"cpu{i} 1 2 3 4 5 6 7 0 0 0" for i in range(cpus)]
    (root / "stat").write_text("\n".join([*lines, "intr 0", "ctxt 0"]) + "\n")
    (root / "meminfo").write_text(f"MemTotal:       {mem_kb} kB\nMemFree:        1000 kB\n")
    return root


def slo_yaml(threshold: int) -> str:
    return (
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata:\n  name: local\nspec:\n"
        f"  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressThresholdPercent: {threshold}\n"
    )


@asynccontextmanager
async def running_agent(tree: dict[str, Any], local: bool) -> AsyncIterator[Agent]:
    agent = Agent(build_config(tree), packages=("kube",), local_mode=local)
    agent.build()
    task = asyncio.create_task(agent.run())
    try:
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


def threshold(agent: Agent) -> int | None:
    slo = agent.bus.state.node_slo
    if slo is None or slo.resource_used_threshold_with_be is None:
        return None
    return slo.resource_used_threshold_with_be.cpu_suppress_threshold_percent


def local_tree(tmp_path: Path, nodeslo_file: Path | None) -> dict[str, Any]:
    tree: dict[str, Any] = {
        "kube": {"node_name": "local-node"},
        "paths": {"proc_root": str(proc_root(tmp_path))},
    }
    if nodeslo_file is not None:
        tree["kube"]["nodeslo_file"] = str(nodeslo_file)
    return tree


async def test_nodeslo_file_edited_while_running_takes_effect(tmp_path: Path) -> None:
    path = tmp_path / "nodeslo.yaml"
    path.write_text(slo_yaml(70))
    async with running_agent(local_tree(tmp_path, path), local=True) as agent:
        local = agent.parts.local_sources
        assert isinstance(local, LocalSources)
        local.poll_seconds = 0.02
        await wait_until(lambda: agent.ready, message="local mode ready")
        assert threshold(agent) == 70
        path.write_text(slo_yaml(45))
        await wait_until(lambda: threshold(agent) == 45, message="edited threshold in force")
        counter = "koordqos_nodeslo_invalid_fields_total"
        before = obs.REGISTRY.get_sample_value(counter, {"source": "file"}) or 0.0
        path.write_text(slo_yaml(45).replace("45", "'not-a-number'"))
        await wait_until(lambda: "not-a-number" in local.nodeslo.last_error, message="invalid edit noticed")
        assert threshold(agent) == 45  # the field's last valid value kept
        assert obs.REGISTRY.get_sample_value(counter, {"source": "file"}) == before + 1
        path.write_text("spec: [unclosed")
        os.utime(path, ns=(1, 1))
        await wait_until(
            lambda: local._file_sig is not None and local._file_sig[0] == 1, message="garbage read"
        )
        assert threshold(agent) == 45
        path.write_text(slo_yaml(30))
        await wait_until(lambda: threshold(agent) == 30, message="valid again")


async def test_local_mode_without_file_uses_defaults_and_procfs(tmp_path: Path) -> None:
    async with running_agent(local_tree(tmp_path, None), local=True) as agent:
        await wait_until(lambda: agent.ready, message="local mode ready")
        assert threshold(agent) == 65
        node = agent.bus.state.node
        assert node is not None
        assert node.capacity == {"cpu": 4000, "memory": 8 * 1024**3}
        assert node.name == "local-node"
        assert isinstance(agent.services.evictor, Evictor)


async def test_local_pods_come_from_nri_sandboxes(tmp_path: Path) -> None:
    async with running_agent(local_tree(tmp_path, None), local=True) as agent:
        await wait_until(lambda: agent.ready, message="ready")
        sandbox = RuntimeSandbox(
            id="sb1",
            uid="uid-1",
            name="batch",
            namespace="ns",
            labels={"koordinator.sh/qosClass": "BE"},
            annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"1-2"}'},
            cgroup_parent="/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_1.slice",
        )
        await agent.bus.publish(RuntimeSandboxUpserted(sandbox))
        await wait_until(lambda: "uid-1" in agent.bus.state.pods, message="pod from sandbox")
        pod = agent.bus.state.pods["uid-1"]
        assert (pod.qos, pod.kube_qos, pod.source, pod.cpuset) == (
            QoSClass.BE,
            KubeQoS.BESTEFFORT,
            "nri",
            "1-2",
        )
        await agent.bus.publish(RuntimeSandboxRemoved("sb1"))
        await wait_until(lambda: "uid-1" not in agent.bus.state.pods, message="pod removed with its sandbox")
        evicted = await agent.services.evictor.evict(pod, "evicted", "test", "CPUEvict")
        assert evicted is True
        assert agent.decisions.recent()[-1].dry_run is True


def test_kube_qos_from_cgroup_parent() -> None:
    assert kube_qos_from_cgroup_parent("kubepods/besteffort/pod1") is KubeQoS.BESTEFFORT
    assert kube_qos_from_cgroup_parent("/kubepods.slice/kubepods-burstable.slice/x") is KubeQoS.BURSTABLE
    assert kube_qos_from_cgroup_parent("/kubepods.slice/kubepods-pod1.slice") is KubeQoS.GUARANTEED


def test_procfs_node_falls_back_when_files_are_missing(tmp_path: Path) -> None:
    node = read_node_from_procfs(tmp_path / "nope", "n")
    assert node.capacity["cpu"] == (os.cpu_count() or 1) * 1000
    assert node.capacity["memory"] == 0


async def test_cluster_mode_agent_becomes_ready_against_the_fake_api_server(
    fake: FakeAPIServer, tmp_path: Path
) -> None:
    fake.upsert("nodes", make_node(NODE))
    fake.upsert("pods", make_pod("p1", NODE, qos="LS"))
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    tree = {"kube": {"node_name": NODE, "kubeconfig": str(kubeconfig)}}
    async with running_agent(tree, local=False) as agent:
        await wait_until(lambda: agent.ready, message="cluster mode ready")
        names = sorted(c.name for c in agent.components)
        assert {"kube-pods", "kube-node", "kube-nodeslo"} <= set(names)
        pod = next(iter(agent.bus.state.pods.values()))
        assert isinstance(pod, PodInfo)
        assert pod.name == "p1"
        ok = await agent.services.evictor.evict(pod, "evicted", "test", "CPUEvict")
        assert ok is True
        await wait_until(lambda: not agent.bus.state.pods, message="evicted pod deleted through the watch")
    await agent.services.kube.close()


def test_a_bad_kubeconfig_stops_the_build(tmp_path: Path) -> None:
    """#32 5e: a kubeconfig that is not one is a start-up error naming it (was: retried forever, unready)."""
    bad = tmp_path / "kubeconfig"
    bad.write_text("this: is: not: a kubeconfig")
    agent = Agent(build_config({"kube": {"node_name": NODE, "kubeconfig": str(bad)}}), packages=("kube",))
    assert not agent.local_mode
    with pytest.raises(ConfigError, match=rf"^--kubeconfig {bad}: not valid YAML at line 1: "):
        agent.build()


async def test_a_kubeconfig_the_loader_refuses_stops_the_agent_before_its_components(tmp_path: Path) -> None:
    """What only kubernetes-asyncio's loader finds (a missing client certificate) ends `run` with a
    ConfigError before any component starts."""
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        f"users: [{{name: u, user: {{client-certificate: {tmp_path}/no.crt, "
        f"client-key: {tmp_path}/no.key}}}}]\n"
    )
    agent = Agent(build_config({"kube": {"node_name": NODE, "kubeconfig": str(kc)}}), packages=("kube",))
    agent.build()
    with pytest.raises(ConfigError, match=rf"^--kubeconfig {kc}: cannot load: .*no.crt"):
        await agent.run()
    reflector = next(c for c in agent.components if c.name == "kube-pods")
    assert reflector.lists == 0  # type: ignore[attr-defined]
    assert not reflector.watch_ends  # type: ignore[attr-defined]
