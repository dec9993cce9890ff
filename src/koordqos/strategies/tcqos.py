"""TCNetworkQoS (docs/network-qos.md, "tc"): HTB classes on the default-route NIC, BE traffic classified:
planner.

Enabled when `policies.netQOSPolicy` is `tc` (or unset) and the NodeSLO has a `systemStrategy`. The plan:

* `1:1` root class, rate = ceil = the total; `1:2` system (rate total − LS min − BE min, ceil total, prio 1);
  `1:3` LS (L1 egress min / max, prio 2); `1:4` BE (L2 egress min / max, prio 3). A class whose `networkQOS`
  is off has no guarantee and the whole NIC as its ceiling;
* which class a pod's traffic takes, from its raw QoS label (SYSTEM / LSE·LSR·LS / BE; a pod without the
  label is left alone): its IP in the class's ipset (a CLASSIFY rule in `mangle POSTROUTING` per set) and,
  on cgroup v1, its `net_cls.classid` (65538 / 65539 / 65540) for the cgroup filters (host-network pods);
* a pod with `koordinator.sh/networkQOS` limits gets a class of its own (rate = ceil = its egress limit) and
  a u32 filter on its IP (host-network pods: its classid).

Project decisions (docs/network-qos.md): a class minor is derived from the pod uid (stable across restarts,
no random handles to rediscover from net_cls); a total of 0 (unknown bandwidth) shapes nothing (koordlet
would install zero-rate classes); host-network pods are not put in the ipsets (their IP is the node's);
the pod limit is applied in bit/s as the annotation says (koordlet divides by 8 twice:
`--net-qos-koordlet-units` gives its numbers). Pure: `plan_tc` turns `TcInputs` into a `TcPlan` and the
classid writes; the round applies it through `host.tc.TcShaper` in a worker thread, when it changed and
every REAPPLY_SECONDS (what someone else changed on the NIC is put back).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from prometheus_client import Counter

from koordqos import observability as obs
from koordqos.cgroups.executor import CgroupWrite, Level
from koordqos.cgroups.resources import CgroupVersion
from koordqos.errors import KoordQoSError, ModelError
from koordqos.host.tc import (
    BE_MINOR,
    LS_MINOR,
    ROOT_MINOR,
    SYSTEM_MINOR,
    HtbClass,
    NetCommands,
    PodFilter,
    TcPlan,
    TcReport,
    TcShaper,
    classid,
)
from koordqos.model.netqos import POLICY_TC, NetClass, NetQoSConfig, net_class, netqos_config, pod_bandwidth
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState
from koordqos.strategies.framework import INVALID_CONFIG, StrategyEnv

if TYPE_CHECKING:
    from koordqos.config import AgentConfig

log = structlog.get_logger("koordqos.strategies.tcqos")

NAME = "TCNetworkQoS"
GATE = "TCNetworkQoS"
REASON = "UpdateNetworkQoS"
REAPPLY_SECONDS = 60.0
POD_MINOR_FIRST = 0x10  # below: the fixed classes; u32 filter prefs share the numbers
POD_MINOR_LAST = 0xFFF0
CLASS_MINOR = {NetClass.SYSTEM: SYSTEM_MINOR, NetClass.LS: LS_MINOR, NetClass.BE: BE_MINOR}
CLASS_PRIO = {NetClass.SYSTEM: 1, NetClass.LS: 2, NetClass.BE: 3, NetClass.NONE: 2}
CGROUP_FILTERS = ((1, SYSTEM_MINOR), (2, LS_MINOR), (3, BE_MINOR))
NET_CLS = "net_cls.classid"


@dataclass(frozen=True)
class TcInputs:
    """One round's inputs."""

    config: NetQoSConfig | None
    pods: Mapping[str, PodInfo]
    pod_dirs: Mapping[str, str]  # uid → pod cgroup dir (pods with a net class)
    net_cls: bool  # cgroup v1: pods get their net_cls.classid
    koordlet_units: bool = False


@dataclass
class TcRound:
    """The plan of one round: `plan` None means "not enabled: clean up"; classid writes; problems."""

    plan: TcPlan | None
    writes: list[CgroupWrite] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    pod_minors: dict[str, int] = field(default_factory=dict)


def enabled(cfg: NetQoSConfig | None) -> bool:
    """koordlet's rule: netQOSPolicy tc (or unset) and a systemStrategy; here also a known total."""
    return cfg is not None and cfg.policy == POLICY_TC and cfg.has_system_strategy and cfg.total > 0


def pod_minor(uid: str, taken: set[int]) -> int | None:
    """A pod's own class minor: from its uid, the next free one on a collision (None: none left)."""
    span = POD_MINOR_LAST - POD_MINOR_FIRST + 1
    start = zlib.crc32(uid.encode()) % span
    for i in range(span):
        minor = POD_MINOR_FIRST + (start + i) % span
        if minor not in taken:
            return minor
    return None


def node_classes(cfg: NetQoSConfig) -> tuple[HtbClass, ...]:
    """The four fixed classes (egress, bit/s)."""
    total = cfg.total
    ls, be = cfg.ls, cfg.be
    ls_ceil = ls.egress_max if ls.enabled else total
    be_ceil = be.egress_max if be.enabled else total
    system_rate = max(total - ls.egress_min - be.egress_min, 0)
    return (
        HtbClass(ROOT_MINOR, 0, total, total),
        HtbClass(SYSTEM_MINOR, ROOT_MINOR, system_rate, total, 1),
        HtbClass(LS_MINOR, ROOT_MINOR, ls.egress_min, min(ls_ceil, total) or total, 2),
        HtbClass(BE_MINOR, ROOT_MINOR, be.egress_min, min(be_ceil, total) or total, 3),
    )


def plan_tc(inp: TcInputs) -> TcRound:
    """The NIC's plan and the pods' classid writes (pure)."""
    cfg = inp.config
    out = TcRound(None)
    if cfg is None or not enabled(cfg):
        return out
    for problem in cfg.problems:
        out.problems[problem.partition(":")[0]] = problem
    classes = list(node_classes(cfg))
    ipsets: dict[str, set[str]] = {c.value: set() for c in CLASS_MINOR}
    filters: list[PodFilter] = []
    taken: set[int] = set()
    pods = sorted(inp.pods.values(), key=lambda p: (p.creation_timestamp, p.uid))
    for pod in pods:
        if pod.terminated:
            continue
        cls = net_class(pod.qos_raw)
        if cls is NetClass.NONE:
            continue
        try:
            limits = pod_bandwidth(pod.annotations)
        except ModelError as exc:
            out.problems[f"pod:{pod.uid}"] = f"{pod.key}: {exc}"
            limits = None
        handle = classid(CLASS_MINOR[cls])
        if limits is not None and limits.limited and limits.egress > 0:
            minor = pod_minor(pod.uid, taken)
            if minor is None:
                out.problems[f"pod:{pod.uid}"] = f"{pod.key}: no tc class left"
            else:
                taken.add(minor)
                out.pod_minors[pod.uid] = minor
                rate = limits.egress // 64 if inp.koordlet_units else limits.egress
                classes.append(HtbClass(minor, ROOT_MINOR, rate, rate, CLASS_PRIO[cls]))
                handle = classid(minor)
                if not pod.host_network and pod.pod_ip:
                    filters.append(PodFilter(minor, pod.pod_ip))
        elif not pod.host_network and pod.pod_ip and ":" not in pod.pod_ip:
            ipsets[cls.value].add(pod.pod_ip)
        parent = inp.pod_dirs.get(pod.uid)
        if inp.net_cls and parent is not None:
            out.writes.append(CgroupWrite(parent, NET_CLS, handle, Level.POD, reason=REASON))
    out.plan = TcPlan(
        tuple(classes),
        CGROUP_FILTERS,
        tuple(sorted(filters, key=lambda f: f.minor)),
        {k: frozenset(v) for k, v in ipsets.items()},
    )
    return out


TC_ROUNDS = Counter(
    "koordqos_tc_apply_total",
    "Network QoS tc rounds applied to the NIC, by action (apply, clean) and result (ok, failed)",
    ["action", "result"],
    registry=obs.REGISTRY,
)


class TCNetworkQoSStrategy:
    """TCNetworkQoS: the plan each round; the NIC brought to it when it changed (or every minute)."""

    name = NAME

    def __init__(self, shaper: TcShaper | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.shaper = shaper
        self.clock = clock
        self._last: tuple[TcPlan | None, float] | None = None
        self.last_round: TcRound | None = None
        self.last_report: TcReport | None = None

    def enabled(self, config: AgentConfig) -> bool:
        """Gate TCNetworkQoS and a positive interval."""
        return config.gate(GATE) and config.qos.reconcile_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--reconcile-interval-seconds."""
        return config.qos.reconcile_interval_seconds

    def _shaper(self, env: StrategyEnv) -> TcShaper:
        if self.shaper is None:
            self.shaper = TcShaper(NetCommands(env.config.qos.net_qos_netns))
        return self.shaper

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Plan; the classid writes through the executor; the NIC through the shaper, off the loop."""
        if state.node_slo is None:
            return  # koordlet acts on a NodeSLO only
        layout = env.layout
        net_cls = layout.version is CgroupVersion.V1
        pod_dirs: dict[str, str] = {}
        if net_cls:
            for uid, pod in state.pods.items():
                if net_class(pod.qos_raw) is not NetClass.NONE and not pod.terminated:
                    with contextlib.suppress(KoordQoSError):
                        pod_dirs[uid] = layout.pod_dir(pod)
        cfg = netqos_config(state.node_slo)
        rnd = plan_tc(TcInputs(cfg, state.pods, pod_dirs, net_cls, env.config.qos.net_qos_koordlet_units))
        self.last_round = rnd
        for key, msg in rnd.problems.items():
            INVALID_CONFIG.labels(NAME).inc()
            env.warn_once(f"tc:{key}:{msg}", "network QoS input ignored", error=msg)
        if cfg is not None and cfg.policy == POLICY_TC and cfg.has_system_strategy and cfg.total <= 0:
            env.warn_once(
                "tc:total", "network QoS: systemStrategy.totalNetworkBandwidth is 0: nothing shaped"
            )
        if rnd.writes:
            await env.apply(NAME, rnd.writes, REASON)
        now = self.clock()
        if self._last is not None and self._last[0] == rnd.plan and now - self._last[1] < REAPPLY_SECONDS:
            return
        action = "clean" if rnd.plan is None else "apply"
        # a decision when the plan changed; the periodic re-apply of the same plan is recorded quietly
        repeat = self._last is not None and self._last[0] == rnd.plan
        env.decisions.record(NAME, "nic", f"tc-{action}", None, _summary(rnd.plan), REASON, quiet=repeat)
        if env.dry_run:
            self._last = (rnd.plan, now)
            return
        shaper = self._shaper(env)
        plan = rnd.plan
        report = await asyncio.to_thread(shaper.clean if plan is None else lambda: shaper.apply(plan))
        self.last_report = report
        failures = report.failures
        TC_ROUNDS.labels(action, "failed" if failures else "ok").inc()
        for step in failures:
            obs.ERRORS.labels("strategies.tcqos", step.action).inc()
            env.warn_once(
                f"tc:{step.action}:{step.target}:{step.error}",
                "network QoS step failed",
                step=step.action,
                target=step.target,
                link=report.link,
                error=step.error,
            )
        # a failed step is retried at the next REAPPLY_SECONDS, not every round (a kernel without the cgroup
        # classifier would fail it every second)
        self._last = (rnd.plan, now)


def _summary(plan: TcPlan | None) -> str:
    if plan is None:
        return "none"
    members = sum(len(v) for v in plan.ipsets.values())
    return f"classes={len(plan.classes)} pod_filters={len(plan.pod_filters)} ipset_members={members}"
