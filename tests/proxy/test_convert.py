"""Proxy request → hook context and ProxyDone merge (docs/behaviour-runtime-hooks.md, "Resources and
conversions", "Pod and container contexts" and "Proxy mode"): pure conversions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.cgroups.layout import CgroupDriver, CgroupLayout
from koordqos.cgroups.resources import CgroupVersion
from koordqos.hooks.context import ContainerContext, ContainerRequest, PodContext, PodRequest
from koordqos.hooks.resources import Resources
from koordqos.model.pod import ContainerInfo, PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.proxy.api import runtime_api_pb2 as rpb
from koordqos.proxy.convert import (
    ProxyConverter,
    ProxyRequestError,
    container_response,
    pod_response,
    resources_from_cri,
)
from koordqos.state import NodeState

from .conftest import be_pod, container_request, pod_request


def layout(tmp_path: Path, driver: CgroupDriver = CgroupDriver.CGROUPFS) -> CgroupLayout:
    return CgroupLayout(tmp_path / "cgroup", CgroupVersion.V1, driver)


def test_cri_resources_zero_means_not_specified() -> None:
    assert resources_from_cri(None) is None
    assert resources_from_cri(rpb.LinuxContainerResources()) == Resources()
    got = resources_from_cri(
        rpb.LinuxContainerResources(
            cpu_shares=512, cpu_quota=-1, memory_limit_in_bytes=-5, cpuset_cpus="1-2", cpu_period=100000
        )
    )
    assert got == Resources(cpu_shares=512, cfs_quota=-1, cpuset="1-2", memory_limit=-1)


@settings(max_examples=200, deadline=None)
@given(
    shares=st.integers(-(2**63), 2**63 - 1),
    quota=st.integers(-(2**63), 2**63 - 1),
    memory=st.integers(-(2**63), 2**63 - 1),
    cpuset=st.text(max_size=8),
)
def test_cri_resources_roundtrip(shares: int, quota: int, memory: int, cpuset: str) -> None:
    req = rpb.LinuxContainerResources(
        cpu_shares=shares, cpu_quota=quota, memory_limit_in_bytes=memory, cpuset_cpus=cpuset
    )
    got = resources_from_cri(req)
    assert got is not None
    assert got.cpu_shares == (shares or None)
    assert got.cfs_quota == (quota or None)
    assert got.memory_limit == (None if memory == 0 else memory if memory > 0 else -1)
    assert got.cpuset == (cpuset or None)


def test_pod_context_from_proxy(tmp_path: Path) -> None:
    conv = ProxyConverter(layout(tmp_path))
    ctx = conv.pod_context(pod_request(be_pod("u-1")), NodeState())
    req = ctx.request
    assert ctx.source == "proxy"
    assert (req.uid, req.namespace, req.name) == ("u-1", "default", "pod-u-1")
    assert req.cgroup_parent == "kubepods/besteffort/podu-1"
    assert req.kube_qos is KubeQoS.BESTEFFORT
    assert req.extended is not None
    assert req.extended.containers["main"].limit("kubernetes.io/batch-cpu") == 2000
    assert req.resources is None  # the proxy pod request carries no Resources (koordlet FromProxy)


def test_systemd_parent_is_expanded(tmp_path: Path) -> None:
    conv = ProxyConverter(layout(tmp_path, CgroupDriver.SYSTEMD))
    req = pod_request(be_pod("u-2"))
    req.cgroup_parent = "kubepods-besteffort-podu_2.slice"
    ctx = conv.pod_context(req, NodeState())
    assert ctx.request.cgroup_parent == (
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu_2.slice"
    )


def test_known_pod_spec_wins_over_annotation(tmp_path: Path) -> None:
    conv = ProxyConverter(layout(tmp_path))
    known = PodInfo(
        uid="u-3",
        namespace="default",
        name="pod-u-3",
        containers=(
            ContainerInfo(
                name="main",
                requests={"kubernetes.io/batch-cpu": 700},
                limits={"kubernetes.io/batch-cpu": 900},
            ),
        ),
    )
    state = NodeState(pods={"u-3": known})
    ctx = conv.container_context(container_request(be_pod("u-3")), state)
    assert ctx.request.extended is not None
    assert ctx.request.extended.limit("kubernetes.io/batch-cpu") == 900


def test_container_context_ids_dirs_and_docker(tmp_path: Path) -> None:
    conv = ProxyConverter(layout(tmp_path))
    pod = be_pod("u-4")
    created = conv.container_context(container_request(pod), NodeState())
    # PreCreateContainer: no id yet, so no container dir
    assert (created.request.container_id, created.request.cgroup_parent) == ("", "")
    assert created.request.pod_cgroup_parent == "kubepods/besteffort/podu-4"
    assert created.request.envs == {"A": "1"}
    assert created.request.resources == Resources(cpu_shares=2)
    started = conv.container_context(container_request(pod, "abc123"), NodeState())
    assert started.request.container_id == "containerd://abc123"
    assert started.request.cgroup_parent == "kubepods/besteffort/podu-4/abc123"
    docker = container_request(pod, "abc123")
    docker.pod_annotations["io.kubernetes.docker.type"] = "container"
    assert conv.container_context(docker, NodeState()).request.container_id == "docker://abc123"
    no_res = container_request(pod)
    no_res.ClearField("container_resources")
    assert conv.container_context(no_res, NodeState()).request.resources is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.ClearField("pod_meta"),
        lambda r: setattr(r.pod_meta, "uid", ""),
        lambda r: setattr(r, "pod_cgroup_parent", "/kubepods/../../etc"),
        lambda r: setattr(r.container_meta, "id", "../../../etc"),
    ],
    ids=["no-pod-meta", "no-uid", "parent-escape", "id-escape"],
)
def test_unusable_container_requests_are_refused(tmp_path: Path, mutate: object) -> None:
    conv = ProxyConverter(layout(tmp_path))
    req = container_request(be_pod("u-5"), "abc")
    mutate(req)  # type: ignore[operator]
    with pytest.raises(ProxyRequestError):
        conv.container_context(req, NodeState())


def test_bad_annotation_leaves_batch_values_unset(tmp_path: Path) -> None:
    conv = ProxyConverter(layout(tmp_path))
    req = pod_request(be_pod("u-6"))
    req.annotations["node.koordinator.sh/extended-resource-spec"] = json.dumps({"containers": {"main": 3}})
    assert conv.pod_context(req, NodeState()).request.extended is None


def test_pod_response_is_prefilled_then_merged() -> None:
    req = pod_request(be_pod("u-7"))
    req.resources.cpu_period = 100000
    req.resources.cpu_shares = 2
    plain = pod_response(req, None)
    assert plain.cgroup_parent == req.cgroup_parent
    assert dict(plain.labels) == dict(req.labels)
    assert plain.resources == req.resources
    ctx = PodContext(PodRequest(uid="u-7"))
    ctx.response.resources = Resources(cpu_shares=1536, cfs_quota=200000, memory_limit=-1, cpu_bvt=-1)
    merged = pod_response(req, ctx).resources
    assert (merged.cpu_shares, merged.cpu_quota, merged.memory_limit_in_bytes) == (1536, 200000, -1)
    assert merged.cpu_period == 100000
    # nothing set by the hooks and nothing in the request: no resources in the reply
    bare = rpb.PodSandboxHookRequest(pod_meta=rpb.PodSandboxMetadata(uid="x"))
    assert not pod_response(bare, PodContext(PodRequest(uid="x"))).HasField("resources")


def test_container_response_merges_resources_and_envs() -> None:
    req = container_request(be_pod("u-8"), resources=rpb.LinuxContainerResources(cpuset_cpus="0-3"))
    req.container_annotations["a"] = "b"
    ctx = ContainerContext(ContainerRequest(pod_uid="u-8"))
    ctx.response.resources = Resources(cpuset="", cfs_quota=-1)
    ctx.response.add_envs["HAMI"] = "1"
    resp = container_response(req, ctx)
    # propagated (docs/behaviour-runtime-hooks.md, "Empty cpuset")
    assert resp.container_resources.cpuset_cpus == ""
    assert resp.container_resources.cpu_quota == -1
    assert dict(resp.container_envs) == {"A": "1", "HAMI": "1"}
    assert dict(resp.container_annotations) == {"a": "b"}
    assert resp.pod_cgroup_parent == req.pod_cgroup_parent
