"""The RuntimeHookService over its unix socket with a grpclib client: what koord-runtime-proxy gets back and
what lands in the pod cgroup files (synthetic node, cgroup v1 and v2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from koordqos.cgroups.resources import CgroupVersion
from koordqos.hooks.context import Stage
from koordqos.observability import REGISTRY
from koordqos.proxy.api import runtime_api_pb2 as rpb

from .conftest import (
    GI,
    AgentEnv,
    be_pod,
    container_request,
    lsr_pod,
    pod_request,
    running_agent,
)


@pytest.fixture(params=[CgroupVersion.V1, CgroupVersion.V2], ids=["v1", "v2"])
async def env(request: pytest.FixtureRequest, short_dir: Path) -> AsyncIterator[AgentEnv]:
    async with running_agent(short_dir, request.param) as e:
        yield e


def pod_cgroup_values(env: AgentEnv, rel: str) -> tuple[str, str, str]:
    """(quota, shares-or-weight, memory limit) of a pod dir, on either cgroup version."""
    node = env.node
    if node.version is CgroupVersion.V2:
        return (
            node.read(rel, "cpu", "cpu.max").split()[0],
            node.read(rel, "cpu", "cpu.weight"),
            node.read(rel, "memory", "memory.max"),
        )
    return (
        env.cpu(rel, "cpu.cfs_quota_us"),
        env.cpu(rel, "cpu.shares"),
        node.read(rel, "memory", "memory.limit_in_bytes"),
    )


def expected_be_pod_files(version: CgroupVersion) -> tuple[str, str, str]:
    shares = 1536
    weight = 1 + ((shares - 2) * 9999) // 262142
    return ("200000", str(weight if version is CgroupVersion.V2 else shares), str(4 * GI))


async def test_be_pod_sandbox_hook_returns_batch_values_and_writes_pod_cgroup(env: AgentEnv) -> None:
    assert env.stub is not None
    pod = be_pod()
    pod_dir = env.node.layout.normalize_parent(pod.cgroup_parent)
    env.node.make_cgroup(pod_dir)  # the kubelet creates the pod cgroup before RunPodSandbox
    req = pod_request(pod)
    req.resources.cpuset_mems = "0"  # something the hooks do not touch: kept from the request
    resp = await env.stub.PreRunPodSandboxHook(req)
    assert resp is not None
    res = resp.resources
    assert (res.cpu_quota, res.cpu_shares, res.memory_limit_in_bytes) == (200000, 1536, 4 * GI)
    assert res.cpuset_mems == "0"
    assert resp.cgroup_parent == pod.cgroup_parent
    assert dict(resp.labels) == {"koordinator.sh/qosClass": "BE"}
    assert dict(resp.annotations) == pod.annotations
    # written before the reply: no waiting needed
    assert pod_cgroup_values(env, pod_dir) == expected_be_pod_files(env.node.version)


async def test_be_create_container_hook_returns_container_resources(env: AgentEnv) -> None:
    assert env.stub is not None
    pod = be_pod()
    kubelet = rpb.LinuxContainerResources(cpu_shares=2, cpuset_cpus="0-3", oom_score_adj=1000)
    resp = await env.stub.PreCreateContainerHook(container_request(pod, resources=kubelet))
    assert resp is not None
    res = resp.container_resources
    assert (res.cpu_quota, res.cpu_shares, res.memory_limit_in_bytes) == (200000, 1536, 4 * GI)
    # the empty cpuset of a BestEffort container replaces the kubelet's one (docs/behaviour-runtime-hooks.md,
    # "Empty cpuset")
    assert res.cpuset_cpus == ""
    assert res.oom_score_adj == 1000  # untouched fields stay as the kubelet sent them
    assert dict(resp.container_envs) == {"A": "1"}
    assert resp.pod_cgroup_parent == pod.cgroup_parent


async def test_lsr_pod_gets_its_cpuset(env: AgentEnv) -> None:
    assert env.stub is not None
    pod = lsr_pod(cpuset="2-3")
    kubelet = rpb.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpuset_cpus="0-3")
    resp = await env.stub.PreCreateContainerHook(container_request(pod, resources=kubelet))
    assert resp is not None
    assert resp.container_resources.cpuset_cpus == "2-3"
    assert resp.container_resources.cpu_quota == -1  # pinned pods are not throttled
    assert resp.container_resources.cpu_shares == 2048


async def test_update_resources_hook_and_hookless_stages(env: AgentEnv) -> None:
    assert env.stub is not None
    pod = be_pod()
    update = await env.stub.PreUpdateContainerResourcesHook(container_request(pod, "c0ffee01"))
    assert update is not None
    assert update.container_resources.cpu_quota == 200000
    # no hook is registered at these stages: the response is the request's fields, unchanged
    req = container_request(pod, "c0ffee01", rpb.LinuxContainerResources(cpu_shares=7, cpuset_cpus="1"))
    for call in (
        env.stub.PreStartContainerHook,
        env.stub.PostStartContainerHook,
        env.stub.PostStopContainerHook,
    ):
        resp = await call(req)
        assert resp is not None
        assert resp.container_resources == req.container_resources
    stopped = await env.stub.PostStopPodSandboxHook(pod_request(pod))
    assert stopped is not None
    assert not stopped.HasField("resources")


def _failing(ctx: Any) -> None:
    raise RuntimeError("boom")


def _requests_total(method: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value("koordqos_proxy_requests_total", {"method": method, "outcome": outcome})
    return value or 0.0


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
async def test_hook_error_under_failure_policy(policy: str, short_dir: Path) -> None:
    async with running_agent(short_dir, policy=policy) as env:
        assert env.stub is not None
        # a hook that raises, after BatchResource and the others in name order
        env.hooks.registry.register(Stage.PRE_CREATE_CONTAINER, "zz-failing", "test", _failing)
        env.hooks.registry.register(Stage.PRE_RUN_POD_SANDBOX, "zz-failing", "test", _failing)
        pod = be_pod()
        pod_dir = env.node.layout.normalize_parent(pod.cgroup_parent)
        env.node.make_cgroup(pod_dir)
        before = env.cpu(pod_dir, "cpu.cfs_quota_us")
        if policy == "Ignore":
            resp = await env.stub.PreCreateContainerHook(container_request(pod))
            assert resp is not None
            assert resp.container_resources.cpu_quota == 200000  # the other hooks' values are there
            sandbox = await env.stub.PreRunPodSandboxHook(pod_request(pod))
            assert sandbox is not None
            assert sandbox.resources.cpu_quota == 200000
            assert env.cpu(pod_dir, "cpu.cfs_quota_us") == "200000"
        else:
            failed = _requests_total("PreCreateContainerHook", "hook_error")
            with pytest.raises(GRPCError) as err:
                await env.stub.PreCreateContainerHook(container_request(pod))
            assert err.value.status is Status.UNKNOWN
            assert "boom" in (err.value.message or "")
            assert _requests_total("PreCreateContainerHook", "hook_error") == failed + 1
            with pytest.raises(GRPCError) as err:
                await env.stub.PreRunPodSandboxHook(pod_request(pod))
            assert err.value.status is Status.UNKNOWN
            # a failed stage writes nothing (docs/behaviour-runtime-hooks.md, "Fail policy writes nothing")
            assert env.cpu(pod_dir, "cpu.cfs_quota_us") == before == "-1"


class RawCodec(CodecBase):
    """Sends bytes as they are (to put malformed payloads on the wire)."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


async def _raw_call(sock: Path, method: str, payload: bytes) -> bytes:
    channel = Channel(path=str(sock), codec=RawCodec())
    try:
        async with channel.request(
            f"/runtime.v1alpha1.RuntimeHookService/{method}", Cardinality.UNARY_UNARY, bytes, bytes
        ) as stream:
            await stream.send_message(payload, end=True)
            reply: bytes | None = await stream.recv_message()
            assert reply is not None
            return reply
    finally:
        channel.close()


async def test_malformed_requests_get_invalid_argument_and_server_keeps_serving(short_dir: Path) -> None:
    async with running_agent(short_dir) as env:
        assert env.stub is not None
        invalid = _requests_total("PreCreateContainerHook", "invalid_argument")
        # a length-delimited field claiming 5 bytes with only 2 there: not a protobuf message
        with pytest.raises(GRPCError) as err:
            await _raw_call(env.sock, "PreCreateContainerHook", b"\x0a\x05ab")
        assert err.value.status is Status.INVALID_ARGUMENT
        assert _requests_total("PreCreateContainerHook", "invalid_argument") == invalid + 1

        # well-formed protobuf the hooks cannot use: no pod uid; a cgroup parent outside the root
        no_uid = rpb.PodSandboxHookRequest(cgroup_parent="/kubepods/besteffort/podx")
        hostile = pod_request(be_pod())
        hostile.cgroup_parent = "/kubepods/../../../etc"
        bad_id = container_request(be_pod(), container_id="../../x")
        for call, req in (
            (env.stub.PreRunPodSandboxHook, no_uid),
            (env.stub.PreRunPodSandboxHook, hostile),
            (env.stub.PreCreateContainerHook, bad_id),
        ):
            with pytest.raises(GRPCError) as err:
                await call(req)  # type: ignore[operator]
            assert err.value.status is Status.INVALID_ARGUMENT
        assert not (env.node.cgroup_root / "etc").exists()

        # the same connection and a new one still get answers
        resp = await env.stub.PreCreateContainerHook(container_request(be_pod()))
        assert resp is not None
        assert resp.container_resources.cpu_quota == 200000
        raw = await _raw_call(
            env.sock, "PreCreateContainerHook", container_request(lsr_pod()).SerializeToString()
        )
        assert rpb.ContainerResourceHookResponse.FromString(raw).container_resources.cpuset_cpus == "2-3"


async def test_bad_extended_resource_spec_is_served_without_batch_values(short_dir: Path) -> None:
    async with running_agent(short_dir) as env:
        assert env.stub is not None
        pod = be_pod()
        pod.annotations["node.koordinator.sh/extended-resource-spec"] = "{not json"
        resp = await env.stub.PreCreateContainerHook(container_request(pod))
        assert resp is not None
        # as koordlet: the annotation is ignored (logged, counted), the request still answered
        assert resp.container_resources.cpu_quota == 0
        assert resp.container_resources.cpu_shares == 2


async def test_dry_run_returns_the_request_unchanged_and_records_what_would_change(short_dir: Path) -> None:
    async with running_agent(short_dir, dry_run=True) as env:
        assert env.stub is not None
        pod = be_pod()
        pod_dir = env.node.layout.normalize_parent(pod.cgroup_parent)
        env.node.make_cgroup(pod_dir)
        before = pod_cgroup_values(env, pod_dir)
        presp = await env.stub.PreRunPodSandboxHook(pod_request(pod))
        assert presp is not None
        assert (presp.resources.cpu_quota, presp.resources.cpu_shares) == (0, 0)  # as sent: nothing set
        kubelet = rpb.LinuxContainerResources(cpu_shares=2, cpuset_cpus="0-3")
        resp = await env.stub.PreCreateContainerHook(container_request(pod, resources=kubelet))
        assert resp is not None
        res = resp.container_resources
        assert (res.cpu_quota, res.cpu_shares, res.cpuset_cpus) == (0, 2, "0-3")  # the kubelet's values
        assert pod_cgroup_values(env, pod_dir) == before  # and no cgroup write
        recorded = [d for d in env.agent.decisions.recent() if d.action == "proxy-adjust"]
        assert len(recorded) == 2
        assert all(d.dry_run for d in recorded)
        assert "200000" in str(recorded[-1].new)  # the decision shows what would have been set
