"""The kubelet's CPU manager as the NRT reports it (docs/reporting.md, "Kubelet sources, in order"). Sans-I/O:
parsers for the `cpu_manager_state` checkpoint and the `/configz` document, and the merge of the sources.

The source order: (1) explicit agent configuration, (2) the kubelet's configz, (3) the checkpoint's
`policyName` (no reserved CPUs). With none, the reporter keeps the previous annotations: `{"policy":"none"}`
is never guessed, since the scheduler would then hand out CPUs the kubelet has pinned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from koordqos.errors import ModelError
from koordqos.model.cpuset import format_cpuset, parse_cpuset
from koordqos.model.quantity import to_milli

_TOPOLOGY_POLICIES = {
    ("container", "single-numa-node"): "SingleNUMANodeContainerLevel",
    ("container", "restricted"): "RestrictedContainerLevel",
    ("container", "best-effort"): "BestEffortContainerLevel",
    ("pod", "single-numa-node"): "SingleNUMANodePodLevel",
    ("pod", "restricted"): "RestrictedPodLevel",
    ("pod", "best-effort"): "BestEffortPodLevel",
}


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """`<kubelet root>/cpu_manager_state`: policy name and the CPUs pinned per pod uid."""

    policy_name: str = ""
    entries: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class KubeletCPUManager:
    """What the NRT says about the kubelet; `source` names the source it came from."""

    policy: str
    options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: str = ""  # cpu-list text, static policy only
    topology_policy: str = "None"
    source: str = ""
    # kubeReserved.cpu + systemReserved.cpu in millicores, to pick reserved CPUs when none are listed
    reserved_milli: int = 0


def parse_checkpoint(text: str) -> CheckpointState:
    """Parse the checkpoint JSON; ModelError when it is not the kubelet's format."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ModelError(f"cpu_manager_state: invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelError("cpu_manager_state: expected an object")
    entries: dict[str, tuple[int, ...]] = {}
    raw_entries = doc.get("entries") or {}
    if not isinstance(raw_entries, dict):
        raise ModelError("cpu_manager_state: entries must be an object")
    for uid, containers in raw_entries.items():
        if not isinstance(containers, dict):
            raise ModelError(f"cpu_manager_state: entries[{uid!r}] must be an object")
        cpus: set[int] = set()
        for value in containers.values():
            cpus.update(parse_cpuset(str(value)))
        entries[str(uid)] = tuple(sorted(cpus))
    return CheckpointState(str(doc.get("policyName", "")), entries)


def topology_policy(scope: str | None, policy: str | None) -> str:
    """kubelet topologyManagerScope/Policy → the NRT's `topologyPolicies[0]` (docs/reporting.md, "Topology
    policy")."""
    return _TOPOLOGY_POLICIES.get(((scope or "container"), policy or ""), "None")


def _cpu_milli(raw: Mapping[str, Any] | None) -> int:
    if not isinstance(raw, Mapping) or "cpu" not in raw:
        return 0
    try:
        return to_milli(str(raw["cpu"]))
    except ModelError:
        return 0


def from_configz(doc: Mapping[str, Any]) -> KubeletCPUManager:
    """The `/configz` answer (`{"kubeletconfig": {...}}`) → the kubelet's CPU manager settings."""
    cfg = doc.get("kubeletconfig", doc)
    if not isinstance(cfg, Mapping):
        raise ModelError("configz: kubeletconfig must be an object")
    policy = str(cfg.get("cpuManagerPolicy") or "none")
    options = cfg.get("cpuManagerPolicyOptions") or {}
    reserved = ""
    if policy == "static" and cfg.get("reservedSystemCPUs"):
        reserved = format_cpuset(parse_cpuset(str(cfg["reservedSystemCPUs"])))
    return KubeletCPUManager(
        policy=policy,
        options={str(k): str(v) for k, v in options.items()} if isinstance(options, Mapping) else {},
        reserved_cpus=reserved,
        topology_policy=topology_policy(cfg.get("topologyManagerScope"), cfg.get("topologyManagerPolicy")),
        source="configz",
        reserved_milli=_cpu_milli(cfg.get("kubeReserved")) + _cpu_milli(cfg.get("systemReserved")),
    )


def from_checkpoint(state: CheckpointState) -> KubeletCPUManager | None:
    """Source (3): the checkpoint's policy name, no reserved CPUs; None when it names no policy."""
    if not state.policy_name:
        return None
    return KubeletCPUManager(policy=state.policy_name, source="checkpoint")


def choose(*sources: KubeletCPUManager | None) -> KubeletCPUManager | None:
    """The first available source (the kubelet-source order is the argument order)."""
    for s in sources:
        if s is not None:
            return s
    return None


def policy_annotation(kubelet: KubeletCPUManager) -> str:
    """`kubelet.koordinator.sh/cpu-manager-policy` JSON (keys omitted when empty, as Go's omitempty)."""
    doc: dict[str, Any] = {"policy": kubelet.policy}
    if kubelet.options:
        doc["options"] = dict(kubelet.options)
    if kubelet.policy == "static" and kubelet.reserved_cpus:
        doc["reservedCPUs"] = kubelet.reserved_cpus
    return json.dumps(doc, separators=(",", ":"))


def reserved_cpu_count(kubelet: KubeletCPUManager) -> int:
    """How many CPUs the static policy reserves when it lists none: ceil(kube + system reserved)."""
    return math.ceil(kubelet.reserved_milli / 1000)
