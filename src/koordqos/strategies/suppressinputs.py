"""CPU suppress, its inputs: a round's `SuppressInputs` from NodeState, the metric store and the NodeSLO
(the scheduler's cpusets, the suppress config, host-application usage)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from koordqos.metrics.store import MetricStore
from koordqos.metrics.types import MetricKind
from koordqos.model.nodeslo import NodeSLO, is_feature_disabled
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS
from koordqos.state import NodeState
from koordqos.strategies.framework import StrategyEnv
from koordqos.strategies.intents import (
    BEDir,
)
from koordqos.strategies.suppressplan import (
    CONTAINER_DEPTH,
    DEFAULT_THRESHOLD_PERCENT,
    HostApp,
    Policy,
    SuppressConfig,
    SuppressInputs,
)
from koordqos.strategies.suppresssmoothing import (
    suppress_usage,
    window_samples,
)
from koordqos.strategies.usage import (
    cpu_manager_policy,
    non_be_host_app,
    reserved_cpus,
    system_qos_exclusive_cpus,
)


def scheduler_cpusets(pods: Mapping[str, PodInfo]) -> dict[str, frozenset[int]]:
    """Resource-status cpusets by pod uid (malformed annotations are reported by the pod model)."""
    out: dict[str, frozenset[int]] = {}
    for uid, pod in pods.items():
        rs = pod.resource_status
        if rs is not None and rs.cpuset:
            out[uid] = frozenset(rs.cpus)
    return out


def bound_by_scheduler(pod: PodInfo | None, pod_cpusets: Mapping[str, frozenset[int]]) -> bool:
    if pod is None:
        return False
    rs = pod.resource_status
    return bool(pod_cpusets.get(pod.uid)) or (rs is not None and bool(rs.numa_node_resources))


# -- wiring: NodeSLO and the node into inputs; the round -----------------------------------------------------


def suppress_config(slo: NodeSLO | None) -> SuppressConfig:
    """SuppressConfig from a (merged) NodeSLO; a missing switch gives `enable=None` (skip the round)."""
    disabled, err = is_feature_disabled(slo, "BECPUSuppress")
    if err is not None or slo is None:
        return SuppressConfig(enable=None)
    t = slo.resource_used_threshold_with_be
    assert t is not None  # is_feature_disabled checked it
    threshold = t.cpu_suppress_threshold_percent
    return SuppressConfig(
        enable=not disabled,
        threshold_percent=DEFAULT_THRESHOLD_PERCENT if threshold is None else threshold,
        min_percent=t.cpu_suppress_min_percent,
        policy=Policy(t.cpu_suppress_policy or Policy.CPUSET.value),
        host_apps=tuple(HostApp(a.name, non_be_host_app(a)) for a in slo.host_applications),
    )


def host_app_used(store: MetricStore, slo: NodeSLO | None) -> dict[str, float]:
    """CollectAllHostAppMetricsLast(cpu): cores by NodeSLO host application name; unmeasured ones omitted."""
    out: dict[str, float] = {}
    for app in slo.host_applications if slo is not None else ():
        v = store.last(MetricKind.HOST_APP_CPU_USAGE, app.name)
        if v is not None:
            out[app.name] = v
    return out


def build_inputs(state: NodeState, env: StrategyEnv) -> SuppressInputs:
    """Read what one round needs: metrics (Last window), the BE cgroups, topology and node annotations."""
    store = env.store
    pods = state.pods
    # system usage is smoothed over --cpu-suppress-usage-window-seconds (suppresssmoothing.py)
    samples = window_samples(env.config.qos.cpu_suppress_usage_window_seconds, env.collect_interval)
    node_used, pod_used = suppress_usage(store, pods, samples)
    pod_dirs: dict[str, str] = {}
    for uid, pod in pods.items():
        if pod.kube_qos is KubeQoS.BESTEFFORT:
            d = env.pod_dir(pod)
            if d is not None:
                pod_dirs[uid] = d
    return assemble_inputs(state, env, node_used, pod_used, env.be_cpuset_dirs(CONTAINER_DEPTH), pod_dirs)


def assemble_inputs(
    state: NodeState,
    env: StrategyEnv,
    node_used: float | None,
    pod_used: Mapping[str, float],
    be_dirs: Sequence[BEDir],
    pod_dirs: Mapping[str, str],
    awaiting_sample: tuple[str, ...] = (),
) -> SuppressInputs:
    """SuppressInputs from the usage and BE dirs a caller gathered, plus what state and env give directly."""
    node = state.node
    return SuppressInputs(
        config=suppress_config(state.node_slo),
        pods=state.pods,
        node=node,
        node_used=node_used,
        pod_used=pod_used,
        host_app_used=host_app_used(env.store, state.node_slo),
        processors=env.processors(),
        be_quota=env.be_quota(),
        be_cpuset=env.be_cpuset(),
        be_dirs=be_dirs,
        pod_dirs=pod_dirs,
        reserved_cpus=reserved_cpus(node),
        system_qos_exclusive=system_qos_exclusive_cpus(node),
        cpu_manager_policy=cpu_manager_policy(node),
        reserved_milli=node.reserved()["cpu"] if node is not None else 0,
        be_cpu_manager=env.config.gate("BECPUSuppress") and env.config.gate("BECPUManager"),
        hysteresis_percent=env.config.qos.cpu_suppress_hysteresis_percent,
        tighten_milli=env.tightening.milli,
        awaiting_sample=awaiting_sample,
    )
