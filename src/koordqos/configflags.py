"""The command-line flags of `AgentConfig`: each flag's dotted field, help, metavar, default and environment
variable, and the generated page docs/configuration.md (`config flags`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from koordqos.config import AgentConfig, KubeSettings
from koordqos.features import NOT_ACTED_ON, NOT_IMPLEMENTED, parse_feature_gates
from koordqos.koordletargs import markdown as koordlet_markdown


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
    value: Any = default_tree() if defaults is None else defaults
    for part in flag.target.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value in (None, "", [], {}):
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def default_tree() -> dict[str, Any]:
    """AgentConfig's defaults as JSON (what `--help` and the page show)."""
    return AgentConfig(kube=KubeSettings(node_name="")).model_dump(mode="json")


def env_name(flag: Flag) -> str:
    """The environment variable that sets `flag`."""
    return "KOORDQOS_" + flag.name.upper().replace("-", "_")


def flags_markdown() -> str:
    """Every flag with its environment variable, default and meaning, as a Markdown table."""
    defaults = default_tree()
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
