"""Fixtures for the proxy-mode tests: an agent on a synthetic node serving the RuntimeHookService on a real
unix socket, and a grpclib client to it."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel

from koordqos.agent import Agent
from koordqos.cgroups.layout import CgroupDriver
from koordqos.cgroups.resources import CgroupVersion
from koordqos.config import build_config
from koordqos.hooks.runtime import RuntimeHooks
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.proxy.api.runtime_api_grpc import RuntimeHookServiceStub
from koordqos.proxy.server import ProxyServer
from koordqos.testing.mock_nri.link import PluginLink
from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.nodefs import SyntheticNode

GI = 1 << 30
ERS = "node.koordinator.sh/extended-resource-spec"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short temp dir (unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer)."""
    d = Path(tempfile.mkdtemp(prefix="kqproxy-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def be_annotations(cpu_limit: int, mem: str, cpu_request: int) -> dict[str, str]:
    """The extended-resource-spec annotation of a one-container (`main`) BE pod."""
    spec = {
        "containers": {
            "main": {
                "requests": {"kubernetes.io/batch-cpu": str(cpu_request), "kubernetes.io/batch-memory": mem},
                "limits": {"kubernetes.io/batch-cpu": str(cpu_limit), "kubernetes.io/batch-memory": mem},
            }
        }
    }
    return {ERS: json.dumps(spec)}


@dataclass(frozen=True)
class PodSpec:
    """One test pod, independent of the protocol it is sent with."""

    uid: str
    qos: str
    cgroup_parent: str  # as the kubelet / runtime sends it
    annotations: dict[str, str]
    container: str = "main"


def be_pod(uid: str = "be-0001", cpu_limit: int = 2000, mem: str = "4Gi", cpu_request: int = 1500) -> PodSpec:
    """A BE pod in the besteffort cgroup with batch resources."""
    return PodSpec(uid, "BE", f"/kubepods/besteffort/pod{uid}", be_annotations(cpu_limit, mem, cpu_request))


def lsr_pod(uid: str = "lsr-0001", cpuset: str = "2-3") -> PodSpec:
    """An LSR pod (Guaranteed) pinned by the scheduler to `cpuset`."""
    return PodSpec(uid, "LSR", f"/kubepods/pod{uid}", {RESOURCE_STATUS: json.dumps({"cpuset": cpuset})})


def pod_request(pod: PodSpec) -> rpb.PodSandboxHookRequest:
    """PodSandboxHookRequest for `pod`, as koord-runtime-proxy builds it from RunPodSandbox."""
    return rpb.PodSandboxHookRequest(
        pod_meta=rpb.PodSandboxMetadata(name=f"pod-{pod.uid}", uid=pod.uid, namespace="default"),
        labels={"koordinator.sh/qosClass": pod.qos},
        annotations=pod.annotations,
        cgroup_parent=pod.cgroup_parent,
    )


def container_request(
    pod: PodSpec, container_id: str = "", resources: rpb.LinuxContainerResources | None = None
) -> rpb.ContainerResourceHookRequest:
    """ContainerResourceHookRequest for `pod`'s container (no id before the runtime created it)."""
    req = rpb.ContainerResourceHookRequest(
        pod_meta=rpb.PodSandboxMetadata(name=f"pod-{pod.uid}", uid=pod.uid, namespace="default"),
        container_meta=rpb.ContainerMetadata(name=pod.container, id=container_id),
        pod_labels={"koordinator.sh/qosClass": pod.qos},
        pod_annotations=pod.annotations,
        pod_cgroup_parent=pod.cgroup_parent,
        container_envs={"A": "1"},
    )
    if resources is not None:
        req.container_resources.CopyFrom(resources)
    else:
        req.container_resources.cpu_shares = 2
    return req


@dataclass
class AgentEnv:
    """A running agent; `stub` talks to its RuntimeHookService, `nri` is the mock runtime's link (if any)."""

    node: SyntheticNode
    agent: Agent
    server: ProxyServer | None
    hooks: RuntimeHooks
    stub: RuntimeHookServiceStub | None
    runtime: MockRuntime | None
    nri: PluginLink | None
    sock: Path
    config_dir: Path

    def cpu(self, rel: str, name: str) -> str:
        return self.node.read(rel, "cpu", name)


@asynccontextmanager
async def running_agent(
    base: Path,
    version: CgroupVersion = CgroupVersion.V1,
    *,
    policy: str = "Ignore",
    proxy: bool = True,
    nri: bool = False,
    hooks_extra: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> AsyncIterator[AgentEnv]:
    """An agent on a synthetic node under `base`, serving proxy mode and/or NRI (to a mock runtime)."""
    node = SyntheticNode(base / "node", version, CgroupDriver.CGROUPFS, extensions=("cpu.bvt_warp_ns",))
    sock = base / "run" / "koordlet.sock"
    config_dir = base / "hookserver.d"
    nri_sock = base / "nri" / "nri.sock"
    runtime: MockRuntime | None = None
    if nri:
        runtime = MockRuntime(nri_sock, request_timeout=2.0)
        await runtime.start()
    hooks_cfg: dict[str, Any] = {
        "reconcile_interval_seconds": 0.1,
        "failure_policy": policy,
        "proxy_enabled": proxy,
        "proxy_addr": str(sock),
        "proxy_config_path": str(config_dir),
        **(hooks_extra or {}),
    }
    cfg = build_config(
        {
            "paths": {
                "cgroup_root": str(node.cgroup_root),
                "proc_root": str(node.proc_root),
                "sys_root": str(node.sys_root),
            },
            "nri": {"enabled": nri, "socket": str(nri_sock), "backoff_seconds": 0.05},
            "hooks": hooks_cfg,
            "executor": {"resource_force_update_seconds": 0},
            "kube": {"node_name": "n1"},
            "dry_run": dry_run,
        }
    )
    agent = Agent(cfg, packages=("kube", "hooks", "nri", "proxy"), local_mode=True)
    agent.build()
    server: ProxyServer | None = agent.parts.proxy
    run = asyncio.create_task(agent.run())
    channel: Channel | None = None
    try:
        link = await runtime.wait_joined(timeout=10) if runtime is not None else None
        stub = None
        if server is not None:
            await asyncio.wait_for(server.started.wait(), 10)
            channel = Channel(path=str(sock))
            stub = RuntimeHookServiceStub(channel)
        yield AgentEnv(node, agent, server, agent.services.hooks, stub, runtime, link, sock, config_dir)
    finally:
        if channel is not None:
            channel.close()
        agent.stop()
        await asyncio.wait_for(run, 10)
        if runtime is not None:
            await runtime.stop()
