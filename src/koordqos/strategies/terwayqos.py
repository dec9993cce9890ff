"""TerwayQoS (docs/network-qos.md, "terway-qos"): the config files terway's QoS reads: planner.

Enabled iff `policies.netQOSPolicy` is `terway-qos`; otherwise both files are removed (nothing happens before
the first NodeSLO). In `--terway-qos-dir` (koordlet: `/host-var-lib/terway/qos`):

* `global_bps_config`: one `name value` line each of `hw_tx_bps_max`, `hw_rx_bps_max`, and
  `offline_l{1,2}_{tx,rx}_bps_{min,max}` (L1 = LS class, L2 = BE class: egress is tx, ingress rx), in bytes/s;
* `pod.json`: pod uid → `{podName, podNamespace, podUID, prio, cgroupDir, qosConfig{ingressBandwidth,
  egressBandwidth}}`: prio SYSTEM 0 / LSE·LSR·LS 1 / BE 2 (no label: Guaranteed, Burstable 1, BestEffort 2),
  the pod's net_cls dir as the host sees it, its `koordinator.sh/networkQOS` limits in bytes/s.

Project decision (docs/network-qos.md): a percentage is of the total in bytes/s like every other value here
(koordlet takes it of the total in bits and writes it as bytes: 8× too much); `--net-qos-koordlet-units`
gives koordlet's numbers. A quantity above the total, or an unreadable one, is a problem: the global file is
then left as it was (koordlet keeps its previous rule on a parse error). A pod with a malformed annotation is
left out of `pod.json` (as koordlet). Pure: `plan_terway` turns the inputs into the two files' content.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from koordqos import observability as obs
from koordqos.errors import KoordQoSError, ModelError
from koordqos.host.terway import GLOBAL_CONFIG, POD_CONFIG, TerwayFiles
from koordqos.model.netqos import POLICY_TERWAY, class_value, pod_bandwidth, quantity_bits, terway_prio
from koordqos.model.nodeslo import NetworkQOS, NodeSLO
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState
from koordqos.strategies.framework import INVALID_CONFIG, StrategyEnv

if TYPE_CHECKING:
    from koordqos.config import AgentConfig

NAME = "TerwayQoS"
GATE = "TerwayQoS"
REASON = "UpdateTerwayQoS"
NET_CLS_ROOT = "/sys/fs/cgroup/net_cls"  # where terway, on the host, finds the pods' net_cls dirs
GLOBAL_KEYS = (
    "hw_tx_bps_max",
    "hw_rx_bps_max",
    "offline_l1_tx_bps_min",
    "offline_l1_tx_bps_max",
    "offline_l1_rx_bps_min",
    "offline_l1_rx_bps_max",
    "offline_l2_tx_bps_min",
    "offline_l2_tx_bps_max",
    "offline_l2_rx_bps_min",
    "offline_l2_rx_bps_max",
)


@dataclass
class TerwayPlan:
    """The two files (None: remove it; a missing key: leave it as it is) and the problems of the round."""

    files: dict[str, str | None] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


def _bytes_value(value: int | str | None, total_bits: int, koordlet_units: bool) -> int:
    """One networkQOS field in bytes/s; ModelError for a quantity above the total or unreadable."""
    if value is None:
        return 0
    if isinstance(value, int):
        pct = class_value(value, total_bits)  # bits
        return pct if koordlet_units else pct // 8
    bits = quantity_bits(value)
    # koordlet compares the bytes with the total in bits (8x lenient)
    if (bits // 8 if koordlet_units else bits) > total_bits:
        raise ModelError(f"quantity {value} is larger than the total {total_bits} bit/s")
    return bits // 8


def global_config(slo: NodeSLO, koordlet_units: bool = False) -> str:
    """`global_bps_config`'s text (ModelError on a bad value)."""
    system = slo.system_strategy
    total = 0
    if system is not None and system.total_network_bandwidth is not None:
        raw = system.total_network_bandwidth
        total = max(raw, 0) if isinstance(raw, int) else quantity_bits(raw)
    values = dict.fromkeys(GLOBAL_KEYS, 0)
    values["hw_tx_bps_max"] = values["hw_rx_bps_max"] = total // 8
    strategy = slo.resource_qos_strategy
    for level, cls in (
        ("l1", None if strategy is None else strategy.ls_class),
        ("l2", None if strategy is None else strategy.be_class),
    ):
        cfg: NetworkQOS | None = None if cls is None else cls.network_qos
        if cfg is None or not cfg.enable:
            continue
        values[f"offline_{level}_rx_bps_min"] = _bytes_value(cfg.ingress_request, total, koordlet_units)
        values[f"offline_{level}_rx_bps_max"] = _bytes_value(cfg.ingress_limit, total, koordlet_units)
        values[f"offline_{level}_tx_bps_min"] = _bytes_value(cfg.egress_request, total, koordlet_units)
        values[f"offline_{level}_tx_bps_max"] = _bytes_value(cfg.egress_limit, total, koordlet_units)
    return "".join(f"{key} {values[key]}\n" for key in GLOBAL_KEYS)


def pod_entry(pod: PodInfo, pod_dir: str) -> dict[str, Any]:
    """One pod's `pod.json` entry (ModelError on a malformed annotation)."""
    limits = pod_bandwidth(pod.annotations)
    return {
        "podName": pod.name,
        "podNamespace": pod.namespace,
        "podUID": pod.uid,
        "prio": terway_prio(pod.qos_raw, pod.kube_qos),
        "cgroupDir": f"{NET_CLS_ROOT}/{pod_dir}" if pod_dir else NET_CLS_ROOT,
        "qosConfig": {"ingressBandwidth": limits.ingress // 8, "egressBandwidth": limits.egress // 8},
    }


def plan_terway(
    slo: NodeSLO | None,
    pods: Mapping[str, PodInfo],
    pod_dirs: Mapping[str, str],
    koordlet_units: bool = False,
) -> TerwayPlan:
    """Both files' content (pure)."""
    plan = TerwayPlan()
    if slo is None:
        return plan
    strategy = slo.resource_qos_strategy
    policy = None if strategy is None or strategy.policies is None else strategy.policies.net_qos_policy
    if policy != POLICY_TERWAY:
        plan.files = {GLOBAL_CONFIG: None, POD_CONFIG: None}
        return plan
    try:
        plan.files[GLOBAL_CONFIG] = global_config(slo, koordlet_units)
    except ModelError as exc:
        plan.problems["networkQOS"] = str(exc)
    entries: dict[str, dict[str, Any]] = {}
    for uid in sorted(pods):
        pod = pods[uid]
        if pod.terminated:
            continue
        try:
            entries[uid] = pod_entry(pod, pod_dirs.get(uid, ""))
        except ModelError as exc:
            plan.problems[f"pod:{uid}"] = f"{pod.key}: {exc}"
    plan.files[POD_CONFIG] = json.dumps(entries, separators=(",", ":"))
    return plan


class TerwayQoSStrategy:
    """TerwayQoS: the files brought to the plan each round (written only when their content differs)."""

    name = NAME

    def __init__(self) -> None:
        self.last_plan: TerwayPlan | None = None
        self._last_files: dict[str, str | None] | None = None

    def enabled(self, config: AgentConfig) -> bool:
        """Gate TerwayQoS and a positive interval."""
        return config.gate(GATE) and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Plan; sync the directory off the loop when the plan's files changed."""
        pod_dirs: dict[str, str] = {}
        for uid, pod in state.pods.items():
            with contextlib.suppress(KoordQoSError):
                pod_dirs[uid] = env.layout.pod_dir(pod)
        plan = plan_terway(state.node_slo, state.pods, pod_dirs, env.config.qos.net_qos_koordlet_units)
        self.last_plan = plan
        for key, msg in plan.problems.items():
            INVALID_CONFIG.labels(NAME).inc()
            env.warn_once(f"terway:{key}:{msg}", "terway QoS input ignored", error=msg)
        if not plan.files or plan.files == self._last_files:
            return
        directory = env.config.qos.terway_qos_dir
        for name, text in plan.files.items():
            action = "remove" if text is None else "write"
            env.decisions.record(NAME, str(directory / name), action, None, text, REASON, quiet=text is None)
        if env.dry_run:
            self._last_files = dict(plan.files)
            return
        result = await asyncio.to_thread(TerwayFiles(directory).sync, plan.files)
        for name, error in result.errors.items():
            obs.ERRORS.labels("strategies.terwayqos", "write").inc()
            env.warn_once(
                f"terway:write:{name}:{error}", "terway QoS file not written", file=name, error=error
            )
        # on an error the next round tries again
        self._last_files = None if result.errors else dict(plan.files)
