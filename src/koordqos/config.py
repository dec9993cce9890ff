"""AgentConfig: typed settings grouped by concern, from flags, KOORDQOS_* env and an optional file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from koordqos.errors import ConfigError
from koordqos.features import parse_feature_gates
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
    # 0: off). Project decision: on by default (docs/performance-history.md, "Busy-polling after a reply")
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
