"""AgentConfig: typed settings grouped by concern, from flags, KOORDQOS_* env and an optional file."""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from koordqos.errors import ConfigError
from koordqos.features import NOT_ACTED_ON, NOT_IMPLEMENTED, parse_feature_gates
from koordqos.koordletargs import markdown as koordlet_markdown
from koordqos.model.duration import parse_go_duration

FailurePolicy = Literal["Ignore", "Fail"]  # the one definition: hook core, NRI and proxy use it

# koordlet's RuntimeHookType values in their fixed order (`koordqos.hooks.context.Stage` is the enum of these)
HOOK_STAGES: tuple[str, ...] = (
    "PreRunPodSandbox",
    "PostStopPodSandbox",
    "PreCreateContainer",
    "PreStartContainer",
    "PostStartContainer",
    "PreUpdateContainerResources",
    "PostStopContainer",
    "PreRemoveRunPodSandbox",
)


def parse_failure_policy(text: str) -> FailurePolicy:
    """koordlet GetFailurePolicyType: exactly `Fail` or `Ignore`."""
    if text == "Fail":
        return "Fail"
    if text == "Ignore":
        return "Ignore"
    raise ConfigError(f"runtime hooks failure policy {text!r}: expected Fail or Ignore")


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostPaths(_Group):
    """Where the node's kernel interfaces are mounted (a synthetic directory in tests)."""

    cgroup_root: Path = Path("/sys/fs/cgroup")
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    # koordlet names every cgroupfs container dir `<id>`; CRI-O really names it `crio-<id>` (project decision)
    crio_cgroupfs_bare_ids: bool = False


class KubeSettings(_Group):
    """How the agent finds the cluster, or runs without one."""

    node_name: str = ""
    kubeconfig: str | None = None
    nodeslo_file: Path | None = None
    resync_seconds: float = Field(300.0, gt=0)
    watch_timeout_seconds: float = Field(240.0, gt=0)
    read_timeout_seconds: float = Field(330.0, gt=0)
    eviction_qps: float = Field(5.0, gt=0)


class NRISettings(_Group):
    """The NRI plugin: socket, registration and reconnect."""

    enabled: bool = True
    socket: Path = Path("/var/run/nri/nri.sock")
    plugin_name: str = "koordqos"
    plugin_index: str = "00"
    connect_timeout_seconds: float = Field(6.0, gt=0)
    backoff_seconds: float = Field(1.0, gt=0)
    backoff_cap_seconds: float = Field(30.0, gt=0)
    # after a reply, poll for the runtime's next request this long before the loop sleeps (nri/busypoll.py;
    # 0: off). Project decision: on by default (docs/performance.md, "Busy-polling after a reply")
    busy_poll_seconds: float = Field(0.0001, ge=0, le=0.01)
    # how many runtime objects NodeState keeps (koordqos.nri.limits): far above a real node's
    max_pod_sandboxes: int = Field(1024, ge=1)
    max_containers: int = Field(8192, ge=1)

    @field_validator("connect_timeout_seconds", "backoff_seconds", "backoff_cap_seconds", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return _seconds(v)

    @field_validator("plugin_index")
    @classmethod
    def _two_digits(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9]{2}", v):
            raise ValueError("must be exactly two digits, e.g. 00")
        return v

    @field_validator("plugin_name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", v):
            raise ValueError("may contain only letters, digits, '_', '.', '+' and '-'")
        return v


class HookSettings(_Group):
    """Runtime hooks (NRI and proxy) and their reconciler."""

    failure_policy: FailurePolicy = "Ignore"
    reconcile_interval_seconds: float = Field(10.0, gt=0)
    proxy_enabled: bool = False
    proxy_addr: Path = Path("/var/run/koordlet/koordlet.sock")
    proxy_config_path: Path = Path("/etc/runtime/hookserver.d")
    # the socket path as koord-runtime-proxy sees it on the host (the registration's remote-endpoint); the
    # listen address may be a container path mounted there
    proxy_host_endpoint: str = "/var/run/koordlet/koordlet.sock"
    proxy_max_connections: int = Field(64, ge=1)
    cpu_idle_on_qos_dirs: bool = False
    proxy_max_message_bytes: int = Field(4 << 20, ge=1024)
    disable_unset_cpu_quota: bool = False
    disable_stages: tuple[str, ...] = ()
    # koordlet serves NRI and the proxy only once its states informer synced; koordqos answers the runtime
    # from the start (project decision, docs/security.md "Start-up"); true: koordlet's order
    wait_for_sync: bool = False

    @field_validator("reconcile_interval_seconds", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return _seconds(v)  # koordlet's --runtime-hooks-reconcile-interval=10s

    @field_validator("disable_stages", mode="before")
    @classmethod
    def _stages(cls, v: Any) -> tuple[str, ...]:
        items = [s.strip() for s in v.split(",")] if isinstance(v, str) else list(v or ())
        for item in items:
            if item and item not in HOOK_STAGES:
                raise ValueError(f"unknown stage {item!r} (known: {', '.join(HOOK_STAGES)})")
        return tuple(i for i in items if i)


class QoSSettings(_Group):
    """QoS manager strategy intervals and cool-downs (koordlet's flags and defaults)."""

    reconcile_interval_seconds: float = 1.0
    cpu_suppress_interval_seconds: float = 1.0
    # Project decision (docs/cpu-suppress-stability.md): a system-usage window and a hysteresis band keep
    # the BE quota steady at short intervals; 0 and 0 give koordlet's last-sample, 1 %-bypass behaviour.
    cpu_suppress_usage_window_seconds: float = Field(5.0, ge=0)
    cpu_suppress_hysteresis_percent: float = Field(5.0, ge=0, le=100)
    # Project decision (docs/cpu-suppress-stability.md): no round while a running BE pod waits (at most this
    # many collect intervals) for its first CPU sample; 0 gives koordlet's split (its CPU as system usage).
    cpu_suppress_new_pod_wait_rounds: int = Field(3, ge=0)
    cpu_evict_interval_seconds: float = 1.0
    memory_evict_interval_seconds: float = 1.0
    memory_evict_cool_time_seconds: float = 4.0
    cpu_evict_cool_time_seconds: float = 20.0
    # koordlet's OnlyEvictByAPI; koordqos always evicts through the Eviction API (PDBs, grace periods), so
    # the value is accepted for compatibility and reported, not a switch to killing containers.
    only_evict_by_api: bool = False
    extension_plugins: dict[str, bool] = Field(default_factory=dict)
    # project decisions of the reconcile strategies (docs/reconcile.md), koordlet's behaviour behind each
    blkio_v2_io_files: bool = (
        True  # cgroup v2: blkio throttles → io.max, weight → io.weight (koordlet: v1 only)
    )
    system_config_restore: bool = True  # a sysctl removed from the NodeSLO gets its pre-koordqos value back
    resctrl_task_sweep_seconds: float = Field(10.0, ge=0)  # 0: every pod's threads every round (koordlet)
    # network QoS (docs/network-qos.md): the namespace whose default-route NIC tc shapes ("": the agent's),
    # terway's config dir, and koordlet's unit slips (percentages of bits as bytes, pod limits / 64)
    net_qos_netns: str = ""
    terway_qos_dir: Path = Path("/var/lib/terway/qos")
    net_qos_koordlet_units: bool = False

    @field_validator("extension_plugins", mode="before")
    @classmethod
    def _plugins(cls, v: Any) -> dict[str, bool]:
        """Parse koordlet's --qos-extension-plugins `name=true,other=false`; a bad entry is an error."""
        if not isinstance(v, str):
            return dict(v or {})
        out: dict[str, bool] = {}
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, raw = part.partition("=")
            value = raw.strip().lower()
            if not sep or not name.strip() or value not in ("true", "false"):
                raise ValueError(f"invalid entry {part!r}: expected name=true|false")
            out[name.strip()] = value == "true"
        return out


class PSIRuleSettings(_Group):
    """One PSI interference rule (docs/psi.md): when it engages, how it climbs, when it restores."""

    enabled: bool = True
    preview: bool = False  # decisions recorded, nothing changed (per rule)
    pod_threshold: float = Field(0.10, gt=0, le=1)  # an LS/LSR/LSE pod's "some" stall fraction (cgroup v2)
    node_threshold: float = Field(0.20, gt=0, le=1)  # the node's "some" stall fraction
    clear_ratio: float = Field(0.5, gt=0, le=1)  # clean below threshold × this (the hysteresis band)
    trigger_rounds: int = Field(3, ge=1)
    clear_rounds: int = Field(10, ge=1)
    cooldown_seconds: float = Field(300.0, ge=0)
    tighten_step_percent: float = Field(10.0, gt=0, le=100)  # of node CPU, per bad round (cpu rule)
    mark_after_rounds: int = Field(3, ge=0)
    evict_after_rounds: int = Field(5, ge=0)
    be_min_usage: float = Field(0.1, ge=0)  # BE use needed to engage: cores (cpu) or GiB (memory)


class PSISettings(_Group):
    """The PSI interference rules (gate PSIInterference) and how they mark the node."""

    interval_seconds: float = Field(1.0, gt=0)
    cpu: PSIRuleSettings = PSIRuleSettings()
    memory: PSIRuleSettings = PSIRuleSettings()
    condition_type: str = "KoordQoSInterference"
    taint_key: str = "koordqos.io/interference"
    # cgroup v1 with a unified hierarchy (hybrid): pod and container PSI from `unified/` (project decision);
    # false: koordlet's, pod PSI on cgroup v2 only
    hybrid_pods: bool = True


class MetricsSettings(_Group):
    """Metrics collection and retention."""

    collect_interval_seconds: float = Field(1.0, gt=0)

    @field_validator("collect_interval_seconds", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return _seconds(v)

    retention_seconds: float = Field(600.0, gt=0)
    # needed: a container's series only when a consumer reads them (project decision); all: koordlet's
    container_metrics: Literal["needed", "all"] = "needed"


def _seconds(v: Any) -> Any:
    """Seconds as a number, or a Go duration string (`3s`, `1m30s`) as koordlet's flags take."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return parse_go_duration(v)
    return v


class ReportSettings(_Group):
    """Reports to Koordinator's control plane: NodeMetric status, NodeResourceTopology, batch capacity."""

    node_metric_enabled: bool = True
    min_write_interval_seconds: float = Field(10.0, ge=0)
    node_topology_sync_interval_seconds: float = Field(3.0, gt=0)
    node_topology_resync_seconds: float = Field(60.0, gt=0)
    kubelet_root: Path = Path("/var/lib/kubelet")
    disable_query_kubelet_config: bool = False
    kubelet_cpu_manager_policy: Literal["", "none", "static"] = ""
    kubelet_cpu_manager_policy_options: dict[str, str] = Field(default_factory=dict)
    kubelet_reserved_cpus: str = ""
    kubelet_topology_manager_policy: str = ""
    kubelet_topology_manager_scope: str = ""
    batch_resource_source: Literal["manager", "agent"] = "manager"
    # the Device object (gate Accelerators, docs/devices.md)
    xpu_device_infos_dir: Path = Path("/var/run/koordlet/xpu-device-infos")
    xpu_enforce_collect_from_device_infos: bool = False
    device_report_empty: bool = False

    @field_validator("node_topology_sync_interval_seconds", "node_topology_resync_seconds", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return _seconds(v)

    @field_validator("kubelet_cpu_manager_policy_options", mode="before")
    @classmethod
    def _options(cls, v: Any) -> Any:
        if isinstance(v, str):
            out: dict[str, str] = {}
            for part in filter(None, (p.strip() for p in v.split(","))):
                key, sep, value = part.partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"invalid entry {part!r}: expected name=value")
                out[key.strip()] = value.strip()
            return out
        return v

    @field_validator("kubelet_reserved_cpus")
    @classmethod
    def _cpus(cls, v: str) -> str:
        from koordqos.model.cpuset import cpu_set

        cpu_set(v)  # ValueError with the text when malformed
        return v


class PredictionSettings(_Group):
    """Node prediction for the NodeMetric's prodReclaimableMetric / prodPeakMetric and the Mid tier
    (docs/prediction.md): koordlet's `--prediction-*` flags and defaults; the checkpoint directory's
    bounds."""

    enabled: bool = True
    checkpoint_dir: Path = Path("/prediction-checkpoints")
    # project bounds (docs/prediction.md): the bytes of the agent's own checkpoint files, the models held
    checkpoint_max_bytes: int = Field(16 << 20, ge=0)
    max_models: int = Field(4096, ge=8)
    # koordlet deletes every file of the directory it cannot read at start; koordqos skips them (logged,
    # counted) unless this is set (project decision)
    checkpoint_delete_invalid: bool = False
    cold_start_seconds: float = Field(24 * 3600.0, ge=0)
    safety_margin_percent: int = Field(10, ge=0, le=1000)
    memory_half_life_seconds: float = Field(24 * 3600.0, gt=0)
    cpu_half_life_seconds: float = Field(12 * 3600.0, gt=0)
    training_interval_seconds: float = Field(60.0, gt=0)
    model_expiration_seconds: float = Field(30 * 60.0, gt=0)
    checkpoint_interval_seconds: float = Field(10 * 60.0, ge=0)
    checkpoint_max_per_step: int = Field(12, ge=0)

    @field_validator(
        "cold_start_seconds",
        "memory_half_life_seconds",
        "cpu_half_life_seconds",
        "training_interval_seconds",
        "model_expiration_seconds",
        "checkpoint_interval_seconds",
        mode="before",
    )
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return _seconds(v)


class ExecutorSettings(_Group):
    """The cgroup executor."""

    resource_force_update_seconds: float = Field(60.0, ge=0)


class ServerSettings(_Group):
    """HTTP endpoints."""

    http_addr: str = "0.0.0.0:9316"
    debug_endpoints: bool = False

    @field_validator("http_addr")
    @classmethod
    def _addr(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:9316")
        del host
        return v


class LogSettings(_Group):
    """Logging."""

    format: Literal["json", "console", "auto"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"


class AgentConfig(_Group):
    """Every setting of the agent, grouped by concern."""

    paths: HostPaths = HostPaths()
    kube: KubeSettings = KubeSettings()
    nri: NRISettings = NRISettings()
    hooks: HookSettings = HookSettings()
    qos: QoSSettings = QoSSettings()
    psi: PSISettings = PSISettings()
    metrics: MetricsSettings = MetricsSettings()
    report: ReportSettings = ReportSettings()
    prediction: PredictionSettings = PredictionSettings()
    executor: ExecutorSettings = ExecutorSettings()
    server: ServerSettings = ServerSettings()
    log: LogSettings = LogSettings()
    feature_gates: dict[str, bool] = Field(default_factory=lambda: parse_feature_gates(None))
    dry_run: bool = False
    shutdown_timeout_seconds: float = Field(5.0, gt=0)
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    # hostMode: the host's paths (koordqos's defaults); dsMode: koordlet's DaemonSet container paths
    agent_mode: Literal["hostMode", "dsMode"] = "hostMode"

    @model_validator(mode="before")
    @classmethod
    def _mode_defaults(cls, data: Any) -> Any:
        """dsMode: where koordlet's DaemonSet mounts the host (`NewDsModeConfig`), for every path not set."""
        if not isinstance(data, Mapping) or data.get("agent_mode") != "dsMode":
            return data
        tree = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
        for dotted, value in DS_MODE_PATHS.items():
            group, key = dotted.split(".")
            sub = tree.setdefault(group, {})
            if isinstance(sub, dict):
                sub.setdefault(key, value)
        return tree

    @field_validator("feature_gates", mode="before")
    @classmethod
    def _gates(cls, v: Any) -> dict[str, bool]:
        try:
            return parse_feature_gates(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def gate(self, name: str) -> bool:
        """Whether feature gate `name` is on."""
        return self.feature_gates.get(name, False)

    @property
    def node_name(self) -> str:
        """This node's name (resolved: flag, then NODE_NAME, then hostname)."""
        return self.kube.node_name


#: koordlet's DaemonSet container paths (`NewDsModeConfig`; the chart's mounts), `--agent-mode=dsMode`
DS_MODE_PATHS: Mapping[str, str] = {
    "paths.cgroup_root": "/host-cgroup/",
    "paths.proc_root": "/proc/",
    "paths.sys_root": "/host-sys/",
    "nri.socket": "/host-var-run/nri/nri.sock",
    "hooks.proxy_addr": "/host-var-run-koordlet/koordlet.sock",
    "hooks.proxy_config_path": "/host-etc-hookserver/",
}


@dataclass(frozen=True)
class Flag:
    """One command-line flag bound to a dotted AgentConfig field."""

    name: str
    target: str
    help: str
    kind: type = str
    choices: Sequence[str] | None = None


FLAGS: tuple[Flag, ...] = (
    Flag("config", "", "YAML file with AgentConfig groups (flags and env override it)"),
    Flag("node-name", "kube.node_name", "node name"),
    Flag("kubeconfig", "kube.kubeconfig", "kubeconfig file; without one (and outside a cluster) local mode"),
    Flag("nodeslo-file", "kube.nodeslo_file", "local mode: NodeSLO YAML/JSON file, watched for changes"),
    Flag("kube-resync-seconds", "kube.resync_seconds", "periodic full re-list of watched objects", float),
    Flag("eviction-qps", "kube.eviction_qps", "maximum evictions per second", float),
    Flag("cgroup-root", "paths.cgroup_root", "cgroup filesystem root"),
    Flag("proc-root", "paths.proc_root", "procfs root"),
    Flag("sys-root", "paths.sys_root", "sysfs root"),
    Flag("dev-root", "paths.dev_root", "device nodes root (RDMA device injection reads the numbers there)"),
    Flag(
        "cgroupfs-crio-bare-container-dirs",
        "paths.crio_cgroupfs_bare_ids",
        "cgroupfs driver: look for CRI-O containers in <id> (koordlet) instead of crio-<id> (CRI-O's name)",
        bool,
    ),
    Flag(
        "psi-hybrid-pods",
        "psi.hybrid_pods",
        "cgroup v1 + unified (hybrid): read pod and container PSI from unified/ (false: koordlet's, v2 only)",
        bool,
    ),
    Flag("nri-socket", "nri.socket", "NRI runtime socket"),
    Flag("enable-nri", "nri.enabled", "serve runtime hooks over NRI", bool),
    Flag("nri-plugin-name", "nri.plugin_name", "NRI plugin name"),
    Flag("nri-plugin-index", "nri.plugin_index", "NRI plugin index (two digits)"),
    Flag("nri-connect-timeout-seconds", "nri.connect_timeout_seconds", "NRI connect timeout", float),
    Flag("nri-backoff-seconds", "nri.backoff_seconds", "first NRI reconnect backoff (doubling)", float),
    Flag("nri-backoff-cap-seconds", "nri.backoff_cap_seconds", "maximum NRI reconnect backoff", float),
    Flag(
        "nri-busy-poll-seconds",
        "nri.busy_poll_seconds",
        "after an NRI reply, poll this long for the next request before sleeping, while the node has a core "
        "nobody else used over the last 0.1 s (from the proc root's stat); 0: off",
        float,
    ),
    Flag(
        "nri-max-pod-sandboxes",
        "nri.max_pod_sandboxes",
        "pod sandboxes of the runtime the agent keeps in its state; new ones past it are answered, not kept",
        int,
    ),
    Flag(
        "nri-max-containers",
        "nri.max_containers",
        "containers of the runtime the agent keeps in its state; new ones past it are answered, not kept",
        int,
    ),
    Flag(
        "runtime-hooks-failure-policy", "hooks.failure_policy", "hook failure policy", str, ("Ignore", "Fail")
    ),
    Flag(
        "runtime-hooks-reconcile-interval",
        "hooks.reconcile_interval_seconds",
        "reconciler period in seconds",
        float,
    ),
    Flag(
        "enable-runtime-hooks-proxy",
        "hooks.proxy_enabled",
        "serve the koord-runtime-proxy hook service",
        bool,
    ),
    Flag("runtime-hooks-addr", "hooks.proxy_addr", "unix socket of the RuntimeHookService"),
    Flag(
        "runtime-hooks-host-endpoint",
        "hooks.proxy_host_endpoint",
        "proxy mode: the socket path koord-runtime-proxy dials (the registration file's remote-endpoint)",
    ),
    Flag(
        "cpu-idle-on-qos-dirs",
        "hooks.cpu_idle_on_qos_dirs",
        "koordlet's cpu.idle=1 on kube-QoS dirs (default: per BE pod; an idle besteffort dir breaks kubelet)",
        bool,
    ),
    Flag(
        "runtime-hooks-max-connections",
        "hooks.proxy_max_connections",
        "proxy mode: connections open at once; more are closed at accept",
        int,
    ),
    Flag(
        "runtime-hooks-max-message-bytes",
        "hooks.proxy_max_message_bytes",
        "proxy mode: larger requests are refused with RESOURCE_EXHAUSTED (grpc-go's 4 MiB default)",
        int,
    ),
    Flag(
        "runtime-hooks-config-path",
        "hooks.proxy_config_path",
        "directory of the runtime-proxy registration file",
    ),
    Flag(
        "runtime-hooks-disable-stages",
        "hooks.disable_stages",
        "proxy mode: stages left out of the runtime-proxy registration, comma-separated",
    ),
    Flag(
        "runtime-hooks-wait-for-sync",
        "hooks.wait_for_sync",
        "serve NRI and the proxy only once pods, Node and NodeSLO synced (koordlet); default: from the start",
        bool,
    ),
    Flag(
        "disable-unset-cpu-quota",
        "hooks.disable_unset_cpu_quota",
        "never write cfs_quota=-1 for cpuset pods",
        bool,
    ),
    Flag(
        "reconcile-interval-seconds", "qos.reconcile_interval_seconds", "reconcile strategies period", float
    ),
    Flag("cpu-suppress-interval-seconds", "qos.cpu_suppress_interval_seconds", "CPU suppress period", float),
    Flag(
        "cpu-suppress-usage-window-seconds",
        "qos.cpu_suppress_usage_window_seconds",
        "CPU suppress: system usage averaged over this window (0: koordlet's last sample)",
        float,
    ),
    Flag(
        "cpu-suppress-hysteresis-percent",
        "qos.cpu_suppress_hysteresis_percent",
        "CPU suppress: keep the BE quota while the target is within this % of capacity (0: koordlet)",
        float,
    ),
    Flag(
        "cpu-suppress-new-pod-wait-rounds",
        "qos.cpu_suppress_new_pod_wait_rounds",
        "CPU suppress: no round while a running BE pod waits (at most this many collect intervals) for "
        "its first CPU sample (0: koordlet, its CPU counts as system usage)",
        int,
    ),
    Flag("cpu-evict-interval-seconds", "qos.cpu_evict_interval_seconds", "CPU evict period", float),
    Flag("memory-evict-interval-seconds", "qos.memory_evict_interval_seconds", "memory evict period", float),
    Flag(
        "memory-evict-cool-time-seconds",
        "qos.memory_evict_cool_time_seconds",
        "memory evict cool-down",
        float,
    ),
    Flag("cpu-evict-cool-time-seconds", "qos.cpu_evict_cool_time_seconds", "CPU evict cool-down", float),
    Flag(
        "only-evict-by-api",
        "qos.only_evict_by_api",
        "koordlet compatibility: koordqos always evicts through the Eviction API",
        bool,
    ),
    Flag("qos-extension-plugins", "qos.extension_plugins", "QoS extension plugin gates, e.g. name=true"),
    Flag(
        "blkio-v2-io-files",
        "qos.blkio_v2_io_files",
        "cgroup v2: blkio throttles go to io.max and the weight to io.weight (false: koordlet, v1 only)",
        bool,
    ),
    Flag(
        "system-config-restore",
        "qos.system_config_restore",
        "a systemStrategy field removed from the NodeSLO restores the file's earlier value (false: koordlet)",
        bool,
    ),
    Flag(
        "net-qos-netns",
        "qos.net_qos_netns",
        "TCNetworkQoS: shape the default-route NIC of this network namespace (`ip netns`; empty: agent's)",
    ),
    Flag("terway-qos-dir", "qos.terway_qos_dir", "TerwayQoS: the directory terway reads its QoS config from"),
    Flag(
        "net-qos-koordlet-units",
        "qos.net_qos_koordlet_units",
        "network QoS: koordlet's units (terway percentages of bits taken as bytes, tc pod limits / 64)",
        bool,
    ),
    Flag(
        "resctrl-task-sweep-seconds",
        "qos.resctrl_task_sweep_seconds",
        "every pod's threads are re-read for resctrl at least this often (0: every round, koordlet)",
        float,
    ),
    Flag(
        "collect-interval", "metrics.collect_interval_seconds", "metrics collection period in seconds", float
    ),
    Flag("metrics-retention-seconds", "metrics.retention_seconds", "metrics history kept in memory", float),
    Flag(
        "container-metrics",
        "metrics.container_metrics",
        "which containers' cgroup files each collect reads: needed (those a strategy uses: CPU burst's)"
        " or all (every container's CPU, throttling and memory, koordlet)",
        str,
        ("needed", "all"),
    ),
    Flag(
        "enable-node-metric-report", "report.node_metric_enabled", "write this node's NodeMetric status", bool
    ),
    Flag(
        "node-metric-min-write-interval-seconds",
        "report.min_write_interval_seconds",
        "never write the NodeMetric status more often; an unchanged report is not rewritten within it",
        float,
    ),
    Flag(
        "node-topology-sync-interval",
        "report.node_topology_sync_interval_seconds",
        "NodeResourceTopology recompute period (seconds or a duration like 3s; gate NodeTopologyReport)",
    ),
    Flag(
        "node-topology-resync-seconds",
        "report.node_topology_resync_seconds",
        "re-read the NodeResourceTopology from the API server at least this often (recreates a deleted one)",
        float,
    ),
    Flag("kubelet-root-dir", "report.kubelet_root", "kubelet root dir (cpu_manager_state checkpoint)"),
    Flag(
        "xpu-device-infos-dir",
        "report.xpu_device_infos_dir",
        "Accelerators: the directory of device-info files (JSON lists of devices) the Device is built from",
    ),
    Flag(
        "xpu-enforce-collect-from-device-infos",
        "report.xpu_enforce_collect_from_device_infos",
        "Accelerators: take devices from the device-info files only, never from NVML",
        bool,
    ),
    Flag(
        "device-report-empty",
        "report.device_report_empty",
        "Accelerators: write a Device with no devices for a node without any (koordlet); default: none",
        bool,
    ),
    Flag(
        "disable-query-kubelet-config",
        "report.disable_query_kubelet_config",
        "do not read the kubelet's /configz through the API server's node proxy",
        bool,
    ),
    Flag(
        "kubelet-cpu-manager-policy",
        "report.kubelet_cpu_manager_policy",
        "the kubelet's CPU manager policy, overriding /configz (none or static)",
        str,
        ("", "none", "static"),
    ),
    Flag(
        "kubelet-cpu-manager-policy-options",
        "report.kubelet_cpu_manager_policy_options",
        "the kubelet's CPU manager policy options, e.g. full-pcpus-only=true",
    ),
    Flag(
        "kubelet-reserved-cpus",
        "report.kubelet_reserved_cpus",
        "the kubelet's reservedSystemCPUs (static policy), overriding /configz",
    ),
    Flag(
        "kubelet-topology-manager-policy",
        "report.kubelet_topology_manager_policy",
        "the kubelet's topology manager policy, overriding /configz",
    ),
    Flag(
        "kubelet-topology-manager-scope",
        "report.kubelet_topology_manager_scope",
        "the kubelet's topology manager scope (container or pod), overriding /configz",
    ),
    Flag(
        "batch-resource-source",
        "report.batch_resource_source",
        "who sets the Node's batch-cpu/batch-memory: manager (koord-manager) or agent (standalone)",
        str,
        ("manager", "agent"),
    ),
    Flag(
        "enable-prediction",
        "prediction.enabled",
        "train the node prediction models and report prodReclaimableMetric / prodPeakMetric",
        bool,
    ),
    Flag(
        "prediction-checkpoint-filepath",
        "prediction.checkpoint_dir",
        "directory of the prediction model checkpoints (the chart mounts it from the host)",
    ),
    Flag(
        "prediction-checkpoint-max-bytes",
        "prediction.checkpoint_max_bytes",
        "the agent's checkpoint files hold at most this many bytes; a checkpoint past it is not written",
        int,
    ),
    Flag(
        "prediction-checkpoint-delete-invalid",
        "prediction.checkpoint_delete_invalid",
        "at start, delete checkpoint-directory files that are not readable checkpoints (koordlet); "
        "default: skip them (logged, counted)",
        bool,
    ),
    Flag(
        "prediction-max-models",
        "prediction.max_models",
        "prediction models held at most; new pods' models past it are not created (counted)",
        int,
    ),
    Flag(
        "prediction-cold-start-duration",
        "prediction.cold_start_seconds",
        "a pod this young (or younger) counts its request as its peak (seconds or a duration like 24h)",
    ),
    Flag(
        "prediction-safety-margin-percent",
        "prediction.safety_margin_percent",
        "predicted peaks are scaled by (100 + this)/100",
        int,
    ),
    Flag(
        "prediction-memory-histogram-decay-halflife",
        "prediction.memory_half_life_seconds",
        "memory histogram half-life (seconds or a duration like 24h)",
    ),
    Flag(
        "prediction-cpu-histogram-decay-halflife",
        "prediction.cpu_half_life_seconds",
        "CPU histogram half-life (seconds or a duration like 12h)",
    ),
    Flag(
        "prediction-training-interval",
        "prediction.training_interval_seconds",
        "training period and metric window of one sample (seconds or a duration like 1m)",
    ),
    Flag(
        "prediction-model-expiration-duration",
        "prediction.model_expiration_seconds",
        "a model not updated for longer is dropped with its checkpoint (seconds or a duration like 30m)",
    ),
    Flag(
        "prediction-model-checkpoint-interval",
        "prediction.checkpoint_interval_seconds",
        "minimum time between two checkpoints of one model (seconds or a duration like 10m)",
    ),
    Flag(
        "prediction-model-checkpoint-max-per-step",
        "prediction.checkpoint_max_per_step",
        "checkpoint files written at most per one-minute round",
        int,
    ),
    Flag(
        "resource-force-update-seconds",
        "executor.resource_force_update_seconds",
        "rewrite cached unchanged cgroup values after this many seconds",
        float,
    ),
    Flag("http-addr", "server.http_addr", "HOST:PORT for /healthz /readyz /metrics"),
    Flag("debug-endpoints", "server.debug_endpoints", "serve /debug/state and /debug/decisions", bool),
    Flag(
        "log-format",
        "log.format",
        "log format (auto: console on a TTY, else json)",
        str,
        ("json", "console", "auto"),
    ),
    Flag("log-level", "log.level", "log level", str, ("debug", "info", "warning", "error")),
    Flag("feature-gates", "feature_gates", "feature gates, e.g. BECPUEvict=true,CPUBurst=false"),
    Flag("dry-run", "dry_run", "record decisions, change nothing", bool),
    Flag(
        "agent-mode",
        "agent_mode",
        "default paths: hostMode (the host's) or dsMode (koordlet's DaemonSet container: /host-cgroup/,"
        " /host-sys/, /host-var-run/nri/nri.sock, /host-var-run-koordlet/koordlet.sock,"
        " /host-etc-hookserver/)",
        str,
        ("hostMode", "dsMode"),
    ),
    Flag("shutdown-timeout-seconds", "shutdown_timeout_seconds", "graceful stop timeout", float),
    Flag(
        "event-loop",
        "event_loop",
        "event loop: uvloop, asyncio (the stdlib loop), auto (uvloop when it can be imported)",
        str,
        ("auto", "asyncio", "uvloop"),
    ),
)


#: What a flag's value is, for `--help` (flags not listed: SECONDS for durations, else NUMBER / VALUE).
_METAVARS = {
    "config": "FILE",
    "node-name": "NAME",
    "kubeconfig": "FILE",
    "nodeslo-file": "FILE",
    "eviction-qps": "QPS",
    "cgroup-root": "DIR",
    "proc-root": "DIR",
    "sys-root": "DIR",
    "nri-socket": "SOCKET",
    "nri-plugin-name": "NAME",
    "nri-plugin-index": "NN",
    "runtime-hooks-addr": "SOCKET",
    "runtime-hooks-host-endpoint": "SOCKET",
    "runtime-hooks-max-connections": "N",
    "nri-max-pod-sandboxes": "N",
    "nri-max-containers": "N",
    "runtime-hooks-max-message-bytes": "BYTES",
    "runtime-hooks-config-path": "DIR",
    "runtime-hooks-disable-stages": "STAGE[,STAGE...]",
    "qos-extension-plugins": "NAME=BOOL[,...]",
    "http-addr": "HOST:PORT",
    "feature-gates": "GATE=BOOL[,...]",
    "prediction-checkpoint-filepath": "DIR",
    "prediction-checkpoint-max-bytes": "BYTES",
    "prediction-max-models": "N",
    "prediction-cold-start-duration": "DURATION",
    "prediction-memory-histogram-decay-halflife": "DURATION",
    "prediction-cpu-histogram-decay-halflife": "DURATION",
    "prediction-training-interval": "DURATION",
    "prediction-model-expiration-duration": "DURATION",
    "prediction-model-checkpoint-interval": "DURATION",
    "prediction-model-checkpoint-max-per-step": "N",
}


def flag_metavar(flag: Flag) -> str:
    """The placeholder `--help` shows for the flag's value."""
    if flag.kind is bool:
        return "BOOL"
    if flag.name in _METAVARS:
        return _METAVARS[flag.name]
    if flag.kind is float:
        return "SECONDS" if "seconds" in flag.name or "interval" in flag.name else "NUMBER"
    return "VALUE"


def flag_default(flag: Flag, defaults: Mapping[str, Any] | None = None) -> str:
    """The flag's default as text ("" when there is none to show); `defaults`: AgentConfig dumped as JSON."""
    if not flag.target:
        return ""
    if flag.name == "node-name":
        return "env NODE_NAME, else the hostname"
    if flag.name == "feature-gates":
        return "koordlet's (list: config flags)"
    value: Any = _default_tree() if defaults is None else defaults
    for part in flag.target.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value in (None, "", [], {}):
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _default_tree() -> dict[str, Any]:
    return AgentConfig(kube=KubeSettings(node_name="")).model_dump(mode="json")


def env_name(flag: Flag) -> str:
    """The environment variable that sets `flag`."""
    return "KOORDQOS_" + flag.name.upper().replace("-", "_")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add every AgentConfig flag to `parser` (values default to None: unset)."""
    defaults = _default_tree()
    for flag in FLAGS:
        opt = "--" + flag.name
        default = flag_default(flag, defaults)
        shown = f"; default {default}" if default else ""
        # argparse's own %(default)s would show None: the value is "unset" until defaults are applied
        helptext = f"{flag.help} [env {env_name(flag)}{shown}]".replace("%", "%%")
        metavar = flag_metavar(flag)
        if flag.kind is bool:
            parser.add_argument(
                opt, dest=_dest(flag), nargs="?", const="true", default=None, metavar=metavar, help=helptext
            )
        else:
            parser.add_argument(
                opt,
                dest=_dest(flag),
                default=None,
                choices=flag.choices,
                metavar="{" + ",".join(flag.choices) + "}" if flag.choices else metavar,
                help=helptext,
            )


def _dest(flag: Flag) -> str:
    return "opt_" + flag.name.replace("-", "_")


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def load_config(
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
) -> AgentConfig:
    """Build AgentConfig from defaults < config file < env < flags; raise ConfigError with one clear line."""
    env = os.environ if env is None else env
    values: dict[str, str] = {}
    for flag in FLAGS:
        if env_name(flag) in env:
            values[flag.name] = env[env_name(flag)]
        if args is not None and getattr(args, _dest(flag), None) is not None:
            values[flag.name] = getattr(args, _dest(flag))
    tree: dict[str, Any] = {}
    cfg_file = values.pop("config", None)
    if cfg_file:
        tree = read_config_file(Path(cfg_file))
    for flag in FLAGS:
        if flag.name in values:
            raw = values[flag.name]
            _set(tree, flag.target, _coerce(flag, raw))
    kube = tree.setdefault("kube", {})
    if not kube.get("node_name"):
        kube["node_name"] = env.get("NODE_NAME") or socket.gethostname()
    return build_config(tree)


def _coerce(flag: Flag, raw: str) -> Any:
    if flag.kind is bool:
        low = str(raw).lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--{flag.name}: invalid boolean {raw!r}")
    return raw


def read_config_file(path: Path) -> dict[str, Any]:
    """Read an AgentConfig YAML file into a plain tree."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def build_config(tree: Mapping[str, Any]) -> AgentConfig:
    """Validate a tree into AgentConfig, raising ConfigError naming the first bad field."""
    try:
        return AgentConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: `field.path: message (got value)`."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        inp = err.get("input")
        got = "" if isinstance(inp, dict | list) else f" (got {inp!r})"
        lines.append(f"{loc}: {msg}{got}")
    return "; ".join(lines)


def flags_markdown() -> str:
    """Every flag with its environment variable, default and meaning, as a Markdown table."""
    defaults = _default_tree()
    rows = [
        "| flag | environment | default | meaning |",
        "|---|---|---|---|",
    ]
    for flag in FLAGS:
        value = flag_default(flag, defaults)
        if flag.name == "node-name":
            shown = "env `NODE_NAME`, else the hostname"
        elif flag.name == "feature-gates":
            shown = "koordlet's (see below)"
        else:
            shown = f"`{value}`" if value else ""
        rows.append(f"| `--{flag.name}` | `{env_name(flag)}` | {shown} | {flag.help} |")
    gates = ", ".join(f"`{k}={str(v).lower()}`" for k, v in sorted(parse_feature_gates(None).items()))
    return (
        "# Configuration\n\n"
        "Generated by `python -m koordqos config flags` (a test keeps this page in step with the code).\n"
        "Precedence: flag > environment > `--config` file (YAML with the settings groups, e.g.\n"
        "`server: {http_addr: ...}`) > default. Boolean flags take `true`/`false` (bare: true).\n\n"
        + "\n".join(rows)
        + "\n\nFeature gates and their defaults (koordlet's names; `AllAlpha` / `AllBeta` set a stage):\n"
        + gates
        + "\n\nOn, these change nothing (the agent warns once at start, listing them): not implemented "
        + ", ".join(f"`{g}`" for g in NOT_IMPLEMENTED)
        + "; not acted on yet "
        + ", ".join(f"`{g}`" for g in NOT_ACTED_ON)
        + ".\n\n## koordlet's flags\n\n"
        "A koordlet DaemonSet's arguments start koordqos: Go's flag syntax is accepted (`-name=value`,\n"
        "one dash or two), a koordqos flag spelled so is that flag, and koordlet's own names mean the\n"
        "koordqos flag beside them (a koordqos flag given as well wins). Those with no effect are accepted\n"
        "and listed once at start. `--agent-mode=dsMode` gives the paths of koordlet's DaemonSet container\n"
        "as defaults.\n\n" + koordlet_markdown() + "\n"
    )
