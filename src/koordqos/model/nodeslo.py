"""NodeSLO: the spec fields the strategies and hooks use, merged with koordlet's defaults.

Field semantics follow Go's `slo.koordinator.sh/v1alpha1` types: every scalar is optional and `None` means
"nil" (not set). A NodeSLO as the agent uses it is *merged* (docs/behaviour-runtime-hooks.md, "NodeSLO
merge"):

1. each top-level strategy (`resourceUsedThresholdWithBE`, `resourceQOSStrategy`, `cpuBurstStrategy`,
   `systemStrategy`, `extensions`) is laid as a JSON overlay onto koordlet's defaults: objects merge key by
   key, lists and scalars replace, unset (null) values leave the default in place;
2. for the LSR, LS and BE classes, a `cpuQOS` / `memoryQOS` / `resctrlQOS` with `enable: false` has its values
   replaced by the "None" template (enable stays false), so a disabled class never carries active values.

`parse_nodeslo(doc)` does both and raises `ModelError` naming the first bad field (types only: the strict
parser of tests and tools); `default_nodeslo()` is the merge of an empty spec (what the agent uses when no
NodeSLO object exists). What the agent applies and `config validate` reports goes through
`koordqos.model.nodeslo_validate.validate_nodeslo` (types, ranges, apiVersion/kind; an invalid field keeps its
last valid value).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from koordqos.errors import ModelError


class _Spec(BaseModel):
    # strict: Go's json.Unmarshal rejects "65" for an int and 1 for a bool, so do we; unknown keys are
    # ignored as Go does (newer CRD fields must not make an agent reject the whole object).
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore", strict=True)


IntOrString = int | str
CPUSuppressPolicy = Literal["cpuset", "cfsQuota"]
CPUEvictPolicy = Literal["evictByRealLimit", "evictByAllocatable"]
CPUBurstPolicy = Literal["none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto"]
CPUPolicy = Literal["", "groupIdentity", "coreSched"]
NetQOSPolicy = Literal["", "tc", "terway-qos"]
MemoryQOSPolicy = Literal["", "default", "none", "auto"]

# Value ranges of Koordinator's NodeSLO CRD (percent fields 0-100, the CPU QoS values), as JSON-schema
# keywords on the fields. `parse_nodeslo` checks types only; `validate_nodeslo` (koordqos.model.
# nodeslo_validate), which both the agent and `config validate` use, rejects a value outside its range and
# keeps the field's last valid value (docs/nodeslo.md). The ranges are the CRD's kubebuilder markers and,
# where the CRD has none, the `validate` tags koord-manager checks the same fields with.
PERCENT: dict[str, Any] = {"minimum": 0, "maximum": 100}
NON_NEGATIVE: dict[str, Any] = {"minimum": 0}
POSITIVE: dict[str, Any] = {"minimum": 1}
SWITCH: dict[str, Any] = {"minimum": 0, "maximum": 1}  # the 0/1 kernel switches


# -- resourceUsedThresholdWithBE ---------------------------------------------------------------------------


class ResourceThresholdStrategy(_Spec):
    """`spec.resourceUsedThresholdWithBE`: CPU suppress and the eviction thresholds (percent values)."""

    enable: bool | None = None
    cpu_suppress_threshold_percent: int | None = Field(
        None, alias="cpuSuppressThresholdPercent", json_schema_extra=PERCENT
    )
    cpu_suppress_min_percent: int | None = Field(
        None, alias="cpuSuppressMinPercent", json_schema_extra=PERCENT
    )
    cpu_suppress_policy: CPUSuppressPolicy | None = Field(None, alias="cpuSuppressPolicy")
    memory_evict_threshold_percent: int | None = Field(
        None, alias="memoryEvictThresholdPercent", json_schema_extra=PERCENT
    )
    memory_evict_lower_percent: int | None = Field(
        None, alias="memoryEvictLowerPercent", json_schema_extra=PERCENT
    )
    cpu_evict_be_satisfaction_lower_percent: int | None = Field(
        None, alias="cpuEvictBESatisfactionLowerPercent", json_schema_extra=PERCENT
    )
    cpu_evict_be_satisfaction_upper_percent: int | None = Field(
        None, alias="cpuEvictBESatisfactionUpperPercent", json_schema_extra=PERCENT
    )
    cpu_evict_be_usage_threshold_percent: int | None = Field(
        None, alias="cpuEvictBEUsageThresholdPercent", json_schema_extra=PERCENT
    )
    cpu_evict_time_window_seconds: int | None = Field(
        None, alias="cpuEvictTimeWindowSeconds", json_schema_extra=POSITIVE
    )
    cpu_evict_threshold_percent: int | None = Field(
        None, alias="cpuEvictThresholdPercent", json_schema_extra=PERCENT
    )
    cpu_evict_lower_percent: int | None = Field(None, alias="cpuEvictLowerPercent", json_schema_extra=PERCENT)
    cpu_evict_policy: CPUEvictPolicy | None = Field(None, alias="cpuEvictPolicy")
    evict_enabled_priority_threshold: int | None = Field(None, alias="evictEnabledPriorityThreshold")
    cpu_allocatable_evict_threshold_percent: int | None = Field(
        None, alias="cpuAllocatableEvictThresholdPercent", json_schema_extra=PERCENT
    )
    cpu_allocatable_evict_lower_percent: int | None = Field(
        None, alias="cpuAllocatableEvictLowerPercent", json_schema_extra=PERCENT
    )
    memory_allocatable_evict_threshold_percent: int | None = Field(
        None, alias="memoryAllocatableEvictThresholdPercent", json_schema_extra=PERCENT
    )
    memory_allocatable_evict_lower_percent: int | None = Field(
        None, alias="memoryAllocatableEvictLowerPercent", json_schema_extra=PERCENT
    )
    allocatable_evict_priority_threshold: int | None = Field(None, alias="allocatableEvictPriorityThreshold")


# -- resourceQOSStrategy -----------------------------------------------------------------------------------


class CPUQOS(_Spec):
    """Per-class CPU QoS: group identity (bvt), sched idle, core-sched expeller."""

    enable: bool | None = None
    group_identity: int | None = Field(
        None, alias="groupIdentity", json_schema_extra={"minimum": -1, "maximum": 2}
    )
    sched_idle: int | None = Field(None, alias="schedIdle", json_schema_extra={"minimum": 0, "maximum": 1})
    core_expeller: bool | None = Field(None, alias="coreExpeller")


class MemoryQOS(_Spec):
    """Per-class memory QoS knobs (percent values of the request/limit, Anolis memcg files)."""

    enable: bool | None = None
    min_limit_percent: int | None = Field(None, alias="minLimitPercent", json_schema_extra=PERCENT)
    low_limit_percent: int | None = Field(None, alias="lowLimitPercent", json_schema_extra=PERCENT)
    throttling_percent: int | None = Field(None, alias="throttlingPercent", json_schema_extra=PERCENT)
    wmark_ratio: int | None = Field(None, alias="wmarkRatio", json_schema_extra=PERCENT)
    wmark_scale_permill: int | None = Field(
        None, alias="wmarkScalePermill", json_schema_extra={"minimum": 1, "maximum": 1000}
    )
    wmark_min_adj: int | None = Field(
        None, alias="wmarkMinAdj", json_schema_extra={"minimum": -25, "maximum": 50}
    )
    priority_enable: int | None = Field(None, alias="priorityEnable", json_schema_extra=SWITCH)
    priority: int | None = Field(None, json_schema_extra={"minimum": 0, "maximum": 12})
    oom_kill_group: int | None = Field(None, alias="oomKillGroup", json_schema_extra=SWITCH)
    page_cache_limit_size: IntOrString | None = Field(None, alias="pageCacheLimitSize")
    page_cache_limit_percent: int | None = Field(
        None, alias="pageCacheLimitPercent", json_schema_extra=PERCENT
    )
    page_cache_reclaim_sync: bool | None = Field(None, alias="pageCacheReclaimSync")
    page_cache_enable: bool | None = Field(None, alias="pageCacheEnable")


class ResctrlQOS(_Spec):
    """Per-class L3 cache way range and memory bandwidth percent."""

    enable: bool | None = None
    # and start < end (validate_nodeslo: an empty way range has no mask)
    cat_range_start_percent: int | None = Field(None, alias="catRangeStartPercent", json_schema_extra=PERCENT)
    cat_range_end_percent: int | None = Field(None, alias="catRangeEndPercent", json_schema_extra=PERCENT)
    mba_percent: int | None = Field(None, alias="mbaPercent", json_schema_extra=PERCENT)


class IOCfg(_Spec):
    """blkio settings of one block device."""

    read_iops: int | None = Field(None, alias="readIOPS", json_schema_extra=NON_NEGATIVE)
    write_iops: int | None = Field(None, alias="writeIOPS", json_schema_extra=NON_NEGATIVE)
    read_bps: int | None = Field(None, alias="readBPS", json_schema_extra=NON_NEGATIVE)
    write_bps: int | None = Field(None, alias="writeBPS", json_schema_extra=NON_NEGATIVE)
    io_weight_percent: int | None = Field(
        None, alias="ioWeightPercent", json_schema_extra={"minimum": 1, "maximum": 100}
    )
    read_latency: int | None = Field(None, alias="readLatency", json_schema_extra=NON_NEGATIVE)
    write_latency: int | None = Field(None, alias="writeLatency", json_schema_extra=NON_NEGATIVE)
    read_latency_percent: int | None = Field(None, alias="readLatencyPercent", json_schema_extra=PERCENT)
    write_latency_percent: int | None = Field(None, alias="writeLatencyPercent", json_schema_extra=PERCENT)
    enable_user_model: bool | None = Field(None, alias="enableUserModel")
    model_read_bps: int | None = Field(None, alias="modelReadBPS", json_schema_extra=POSITIVE)
    model_write_bps: int | None = Field(None, alias="modelWriteBPS", json_schema_extra=POSITIVE)
    model_read_seq_iops: int | None = Field(None, alias="modelReadSeqIOPS", json_schema_extra=POSITIVE)
    model_write_seq_iops: int | None = Field(None, alias="modelWriteSeqIOPS", json_schema_extra=POSITIVE)
    model_read_rand_iops: int | None = Field(None, alias="modelReadRandIOPS", json_schema_extra=POSITIVE)
    model_write_rand_iops: int | None = Field(None, alias="modelWriteRandIOPS", json_schema_extra=POSITIVE)


class BlockCfg(_Spec):
    """One blkio target: a device, a volume group or a pod volume."""

    name: str = ""
    type: Literal["device", "volumegroup", "podvolume"] = "device"
    io_cfg: IOCfg = Field(default_factory=IOCfg, alias="ioCfg")


class BlkIOQOS(_Spec):
    """Per-class blkio QoS (a nil `enable` counts as false: docs/reconcile.md, "Blkio")."""

    enable: bool | None = None
    blocks: tuple[BlockCfg, ...] = Field((), strict=False)  # a JSON array


class NetworkQOS(_Spec):
    """Per-class network QoS: percent of the total bandwidth (int) or a quantity string."""

    enable: bool | None = None
    ingress_request: IntOrString | None = Field(None, alias="ingressRequest")
    ingress_limit: IntOrString | None = Field(None, alias="ingressLimit")
    egress_request: IntOrString | None = Field(None, alias="egressRequest")
    egress_limit: IntOrString | None = Field(None, alias="egressLimit")


class ResourceQOS(_Spec):
    """All QoS settings of one class."""

    cpu_qos: CPUQOS | None = Field(None, alias="cpuQOS")
    memory_qos: MemoryQOS | None = Field(None, alias="memoryQOS")
    resctrl_qos: ResctrlQOS | None = Field(None, alias="resctrlQOS")
    blkio_qos: BlkIOQOS | None = Field(None, alias="blkioQOS")
    network_qos: NetworkQOS | None = Field(None, alias="networkQOS")


class ResourceQOSPolicies(_Spec):
    """Which CPU (group identity / core sched) and network QoS mechanism is in use."""

    cpu_policy: CPUPolicy | None = Field(None, alias="cpuPolicy")
    net_qos_policy: NetQOSPolicy | None = Field(None, alias="netQOSPolicy")


class ResourceQOSStrategy(_Spec):
    """`spec.resourceQOSStrategy`: per-class QoS settings."""

    policies: ResourceQOSPolicies | None = None
    lsr_class: ResourceQOS | None = Field(None, alias="lsrClass")
    ls_class: ResourceQOS | None = Field(None, alias="lsClass")
    be_class: ResourceQOS | None = Field(None, alias="beClass")
    system_class: ResourceQOS | None = Field(None, alias="systemClass")
    cgroup_root: ResourceQOS | None = Field(None, alias="cgroupRoot")

    def for_class(self, qos: str) -> ResourceQOS | None:
        """Class config by Koordinator QoS (with default): LSE/LSR→lsrClass, LS, BE, SYSTEM; else None."""
        return {
            "LSE": self.lsr_class,
            "LSR": self.lsr_class,
            "LS": self.ls_class,
            "BE": self.be_class,
            "SYSTEM": self.system_class,
        }.get(qos)


# -- cpuBurstStrategy / systemStrategy / hostApplications --------------------------------------------------


class CPUBurstConfig(_Spec):
    """CPU burst settings; also the pod annotation `koordinator.sh/cpuBurst` (merged field by field)."""

    policy: CPUBurstPolicy | None = None
    cpu_burst_percent: int | None = Field(
        None, alias="cpuBurstPercent", json_schema_extra={"minimum": 0, "maximum": 10000}
    )
    cfs_quota_burst_percent: int | None = Field(
        None, alias="cfsQuotaBurstPercent", json_schema_extra={"minimum": 100}
    )
    cfs_quota_burst_period_seconds: int | None = Field(
        None, alias="cfsQuotaBurstPeriodSeconds", json_schema_extra={"minimum": -1}
    )


class CPUBurstStrategy(CPUBurstConfig):
    """`spec.cpuBurstStrategy` (the config is inlined, plus the share-pool threshold)."""

    share_pool_threshold_percent: int | None = Field(
        None, alias="sharePoolThresholdPercent", json_schema_extra=PERCENT
    )


class SystemStrategy(_Spec):
    """`spec.systemStrategy`: host sysctls and sched features."""

    min_free_kbytes_factor: int | None = Field(None, alias="minFreeKbytesFactor", json_schema_extra=POSITIVE)
    watermark_scale_factor: int | None = Field(
        None, alias="watermarkScaleFactor", json_schema_extra={"minimum": 1, "maximum": 400}
    )
    memcg_reap_back_ground: int | None = Field(None, alias="memcgReapBackGround", json_schema_extra=SWITCH)
    sched_group_identity_enabled: int | None = Field(None, alias="schedGroupIdentityEnabled")
    sched_idle_saver_wmark: int | None = Field(None, alias="schedIdleSaverWmark")
    page_cache_limit_enabled: int | None = Field(
        None, alias="pageCacheLimitEnabled", json_schema_extra=SWITCH
    )
    total_network_bandwidth: IntOrString | None = Field(None, alias="totalNetworkBandwidth")
    sched_features: dict[str, bool] | None = Field(None, alias="schedFeatures")


class CgroupPath(_Spec):
    """Where a host application's cgroup lives."""

    base: Literal["CgroupRoot", "Kubepods", "KubepodsBurstable", "KubepodsBesteffort"] = "CgroupRoot"
    parent_dir: str = Field("", alias="parentDir")
    relative_path: str = Field("", alias="relativePath")


class HostApplicationSpec(_Spec):
    """An out-of-band application on the node, considered in usage splits and hooks."""

    name: str
    priority: str = ""
    qos: str = ""
    cgroup_path: CgroupPath | None = Field(None, alias="cgroupPath")
    strategy: dict[str, Any] | None = None


class NodeSLO(_Spec):
    """A NodeSLO spec (merged with defaults when it came through `parse_nodeslo`) and its object metadata."""

    resource_used_threshold_with_be: ResourceThresholdStrategy | None = Field(
        None, alias="resourceUsedThresholdWithBE"
    )
    resource_qos_strategy: ResourceQOSStrategy | None = Field(None, alias="resourceQOSStrategy")
    cpu_burst_strategy: CPUBurstStrategy | None = Field(None, alias="cpuBurstStrategy")
    system_strategy: SystemStrategy | None = Field(None, alias="systemStrategy")
    extensions: dict[str, Any] | None = None
    host_applications: tuple[HostApplicationSpec, ...] = Field((), alias="hostApplications", strict=False)
    # object metadata (not part of the spec)
    name: str = ""
    resource_version: str = ""
    generation: int = 0


# -- pod-level overrides -----------------------------------------------------------------------------------


class PodMemoryQOSConfig(MemoryQOS):
    """Pod annotation `koordinator.sh/memoryQOS`: a policy plus inline MemoryQOS fields."""

    policy: MemoryQOSPolicy | None = None


class PodCPUQOSConfig(_Spec):
    """Pod annotation `koordinator.sh/cpuQOS` (groupIdentity must be in [-1, 2])."""

    enable: bool | None = None
    group_identity: int | None = Field(None, alias="groupIdentity", ge=-1, le=2)


# -- defaults and merge ------------------------------------------------------------------------------------

#: Values a disabled class carries instead of its configured ones (koordlet's None templates).
NONE_CPU_QOS: Mapping[str, Any] = {"groupIdentity": 0, "schedIdle": 0, "coreExpeller": False}
NONE_MEMORY_QOS: Mapping[str, Any] = {
    "minLimitPercent": 0,
    "lowLimitPercent": 0,
    "throttlingPercent": 0,
    "wmarkRatio": 0,
    "wmarkScalePermill": 50,
    "wmarkMinAdj": 0,
    "priorityEnable": 0,
    "priority": 0,
    "oomKillGroup": 0,
}
NONE_RESCTRL_QOS: Mapping[str, Any] = {
    "catRangeStartPercent": 0,
    "catRangeEndPercent": 100,
    "mbaPercent": 100,
}


def _class_defaults(
    group_identity: int, core_expeller: bool, wmark_min_adj: int, cat_end: int
) -> dict[str, Any]:
    """One QoS class's default block (LSR and LS share theirs; BE differs in four values)."""
    return {
        "cpuQOS": {
            "enable": False,
            "groupIdentity": group_identity,
            "schedIdle": 0,
            "coreExpeller": core_expeller,
        },
        "memoryQOS": {
            **NONE_MEMORY_QOS,
            "enable": False,
            "wmarkRatio": 95,
            "wmarkScalePermill": 20,
            "wmarkMinAdj": wmark_min_adj,
        },
        "resctrlQOS": {**NONE_RESCTRL_QOS, "enable": False, "catRangeEndPercent": cat_end},
        "blkioQOS": {"enable": False},
        "networkQOS": {
            "enable": False,
            "ingressRequest": 0,
            "ingressLimit": 100,
            "egressRequest": 0,
            "egressLimit": 100,
        },
    }


#: koordlet's `sloconfig.DefaultNodeSLOSpecConfig()`, in wire form (camelCase), before the None-merge.
DEFAULT_SPEC: Mapping[str, Any] = {
    "resourceUsedThresholdWithBE": {
        "enable": False,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70,
        "cpuEvictPolicy": "evictByRealLimit",
    },
    "resourceQOSStrategy": {
        "policies": {"cpuPolicy": "groupIdentity", "netQOSPolicy": "tc"},
        "lsrClass": _class_defaults(2, True, -25, 100),
        "lsClass": _class_defaults(2, True, -25, 100),
        "beClass": _class_defaults(-1, False, 50, 30),
        "systemClass": {
            "cpuQOS": {"enable": False, **NONE_CPU_QOS},
            "memoryQOS": {"enable": False, **NONE_MEMORY_QOS},
        },
    },
    "cpuBurstStrategy": {
        "policy": "none",
        "cpuBurstPercent": 1000,
        "cfsQuotaBurstPercent": 300,
        "cfsQuotaBurstPeriodSeconds": -1,
        "sharePoolThresholdPercent": 50,
    },
    "systemStrategy": {"totalNetworkBandwidth": "0"},
    "extensions": {},
}

MERGED_KEYS = (
    "resourceUsedThresholdWithBE",
    "resourceQOSStrategy",
    "cpuBurstStrategy",
    "systemStrategy",
    "extensions",
)


def deep_overlay(base: Any, overlay: Any) -> Any:
    """JSON overlay as Go's `json.Unmarshal` onto a filled struct: objects merge, lists/scalars replace,
    null leaves the base value."""
    if overlay is None:
        return copy.deepcopy(base)
    if isinstance(base, Mapping) and isinstance(overlay, Mapping):
        out = {k: copy.deepcopy(v) for k, v in base.items()}
        for k, v in overlay.items():
            if v is None:
                continue
            out[k] = deep_overlay(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(overlay)


def replace_disabled(qos_strategy: dict[str, Any]) -> None:
    for cls in ("lsrClass", "lsClass", "beClass"):
        conf = qos_strategy.get(cls)
        if not isinstance(conf, dict):
            continue
        for key, none in (
            ("cpuQOS", NONE_CPU_QOS),
            ("memoryQOS", NONE_MEMORY_QOS),
            ("resctrlQOS", NONE_RESCTRL_QOS),
        ):
            sub = conf.get(key)
            if isinstance(sub, dict) and sub.get("enable") is False:
                # the None template replaces the values; unrelated (newer) keys are dropped as in koordlet
                conf[key] = {"enable": False, **none}


def merge_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Raw spec dict → spec dict overlaid onto the defaults (before the None templates are applied)."""
    out: dict[str, Any] = {}
    for key in MERGED_KEYS:
        value = spec.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ModelError(f"{key}: expected an object (got {_short(value)})")
        out[key] = deep_overlay(DEFAULT_SPEC[key], value)
    for key, value in spec.items():
        if key not in MERGED_KEYS:
            out[key] = value
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_model_error(exc: ValidationError) -> str:
    """One line per problem: `dotted.field: message (got value)`, using the wire (camelCase) names."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        inp = err.get("input")
        got = "" if isinstance(inp, dict | list) or err["type"] == "missing" else f" (got {_short(inp)})"
        lines.append(f"{loc}: {msg}{got}")
    return "; ".join(lines)


def object_metadata(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The NodeSLO model's metadata fields of an object's `metadata` ({} without one)."""
    if meta is None:
        return {}
    gen = meta.get("generation", 0)
    return {
        "name": str(meta.get("name", "")),
        "resource_version": str(meta.get("resourceVersion", "")),
        "generation": gen if isinstance(gen, int) and not isinstance(gen, bool) else 0,
    }


def parse_nodeslo(doc: Mapping[str, Any]) -> NodeSLO:
    """Validate a NodeSLO object (or a bare spec), merged with koordlet's defaults; ModelError if invalid."""
    if not isinstance(doc, Mapping):
        raise ModelError(f"expected a NodeSLO object (got {_short(doc)})")
    meta = doc.get("metadata")
    spec = doc.get("spec", doc if "kind" not in doc else {})
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise ModelError(f"spec: expected an object (got {_short(spec)})")
    merged = merge_spec(spec)
    merged.update(object_metadata(meta if isinstance(meta, Mapping) else None))
    merged.pop("kind", None)
    merged.pop("apiVersion", None)
    merged.pop("metadata", None)
    try:
        # validate the overlay first, so a bad value inside a class that the None template is about to
        # replace is still reported (koordlet's json.Unmarshal fails before its merge, too)
        NodeSLO.model_validate(merged)
        replace_disabled(merged["resourceQOSStrategy"])
        return NodeSLO.model_validate(merged)
    except ValidationError as exc:
        raise ModelError(format_model_error(exc)) from None


@lru_cache(maxsize=1)
def default_nodeslo() -> NodeSLO:
    """The merged defaults: what the agent uses when no NodeSLO object exists."""
    return parse_nodeslo({})


def merge_pod_cpu_burst(node: CPUBurstConfig | None, pod: CPUBurstConfig | None) -> CPUBurstConfig | None:
    """Pod `koordinator.sh/cpuBurst` over the node config, field by field (pod fields win)."""
    if pod is None:
        return node
    if node is None:
        return pod
    return node.model_copy(update=pod.model_dump(exclude_none=True, exclude_unset=True))


# -- the second-level feature switch (docs/behaviour-qos-manager.md, "Feature gates and the NodeSLO switch")

SWITCHED_FEATURES = frozenset(
    {
        "BECPUSuppress",
        "BEMemoryEvict",
        "BECPUEvict",
        "CPUEvict",
        "MemoryEvict",
        "CPUAllocatableEvict",
        "MemoryAllocatableEvict",
    }
)


def is_feature_disabled(slo: NodeSLO | None, feature: str) -> tuple[bool, str | None]:
    """koordlet `IsFeatureDisabled` → (disabled, error): skip the round on error, feature off if disabled."""
    if feature not in SWITCHED_FEATURES:
        return True, f"unsupported feature {feature}"
    if slo is None:
        return True, "nodeSLO is nil"
    threshold = slo.resource_used_threshold_with_be
    if threshold is None or threshold.enable is None:
        return True, "nodeSLO resourceUsedThresholdWithBE.enable is nil"
    return not threshold.enable, None
