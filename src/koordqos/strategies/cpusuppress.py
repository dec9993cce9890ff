"""CPUSuppress (docs/behaviour-qos-manager.md, "CPU suppress"): cap the CPU the besteffort subtree may use
(CFS quota or a smaller cpuset).

`suppress = capacity × threshold − non-BE pod usage − non-BE host-app usage − system usage` (milli-CPU),
floored by `cpuSuppressMinPercent`. The `cfsQuota` policy turns it into the besteffort dir's quota (with a
1 % bypass and a 10 %-of-capacity step-up limit); the `cpuset` policy into a set of CPUs picked from the
LSR and LS pools (LSE CPUs never go to BE). When the NodeSLO switch is off, both are recovered.
Pure: `CPUSuppress.plan` turns inputs into `CgroupWrite` intents; the framework reads and writes. The
arithmetic and the plan's data are `suppressplan`, the inputs' assembly `suppressinputs`; this module is the
round: `CPUSuppress` (status memory, the plan) and `CPUSuppressStrategy` (the strategy the framework ticks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace

from prometheus_client import Gauge

from koordqos.cgroups.executor import CgroupWrite, Level, Outcome, WriteResult
from koordqos.config import AgentConfig
from koordqos.model.cpuset import format_cpuset
from koordqos.model.pod import PodInfo
from koordqos.model.qos import KubeQoS, QoSClass
from koordqos.observability import REGISTRY
from koordqos.state import NodeState
from koordqos.strategies.framework import Pace, StrategyEnv
from koordqos.strategies.intents import (
    CFS_QUOTA,
    CPUSET_CPUS,
    REASON_ADJUST_BE_BY_NODE_CPU_USAGE,
    REASON_UPDATE_CPU,
    BEDir,
    level_of,
)
from koordqos.strategies.suppressevents import node_reference, suppress_event
from koordqos.strategies.suppressinputs import (
    assemble_inputs,
    bound_by_scheduler,
    scheduler_cpusets,
)
from koordqos.strategies.suppressplan import (
    CFS_PERIOD,
    CONTAINER_DEPTH,
    POD_DEPTH,
    UNSET_QUOTA,
    Policy,
    Status,
    SuppressInputs,
    SuppressPlan,
    be_cpu_count,
    be_suppress_milli,
    cpu_pools,
    pick_suppressed_cpuset,
    plan_cfs_quota,
    quota_target,
    recovery_cpuset,
    suppress_floor,
)
from koordqos.strategies.suppresssamples import FirstSampleWait
from koordqos.strategies.suppresssmoothing import (
    QuotaHysteresis,
    suppress_usage_paced,
    window_samples,
)
from koordqos.strategies.usage import (
    calculate_filter_pods_used,
    non_be_pod,
)

NAME = "BECPUSuppress"  # its koordlet gate (koordlet's strategy: CPUSuppress)
# A full round this often: the BE dirs walked again and every write planned and checked against the files
# (between full rounds an unchanged plan writes nothing and the walk follows the BE pods).
FULL_PASS_SECONDS = 60.0

BE_SUPPRESS_LS_USED = Gauge(
    "koordqos_be_suppress_ls_used_cores",
    "Non-BE pod + host-app + system CPU usage seen by CPU suppress",
    registry=REGISTRY,
)
BE_SUPPRESS_CORES = Gauge(
    "koordqos_be_suppress_cores",
    "CPU cores left to best-effort pods by CPU suppress",
    ["policy"],
    registry=REGISTRY,
)


# -- the strategy --------------------------------------------------------------------------------------------


class CPUSuppress:
    """CPU suppress with its per-policy status memory (so recovery of an unused policy is written once)."""

    name = NAME

    def __init__(self) -> None:
        self.statuses: dict[Policy, Status] = {}
        self.hysteresis = QuotaHysteresis()
        # Write groups (a recovery, an applied BE cpuset) whose every write landed, with the inputs they
        # were planned from: planned again only when those inputs change, in a full round, or after a
        # round with a problem (`settle`). Between full rounds a file changed behind our back stays so.
        self.landed: dict[str, object] = {}
        self._pending: dict[str, object] = {}
        self._full = True
        self._cpusets_of: Mapping[str, PodInfo] | None = None
        self._non_be_of: Mapping[str, PodInfo] | None = None
        self._non_be_flags: dict[str, bool] = {}
        self._cpusets: dict[str, frozenset[int]] = {}

    def plan(self, inp: SuppressInputs, full: bool = True) -> SuppressPlan:
        """One round of CPU suppress (or recovery): the cgroup writes to make, in order.

        `full=False` leaves out the write groups that landed from the same inputs before (see `landed`).
        """
        out = SuppressPlan()
        cfg = inp.config
        self._full = full
        self._pending = {}
        pod_cpusets = self._scheduler_cpusets(inp.pods)
        if cfg.enable is None:
            out.skipped = "resourceUsedThresholdWithBE.enable not set"
            return out
        if inp.be_cpu_manager:
            out.writes += self.recover_cfs_quota(inp)
            out.writes += self._recover_cpuset_for_be_cpu_manager(inp, pod_cpusets)
            return out
        if not cfg.enable:
            out.writes += self.recover_cfs_quota(inp)
            out.writes += self._recover_cpuset(inp, pod_cpusets, CONTAINER_DEPTH)
            return out
        if inp.node is None:
            out.skipped = "node unknown"
            return out
        if not inp.pods:
            out.skipped = "no pods"
            return out
        if inp.node_used is None:
            out.skipped = "node cpu usage unavailable"
            return out
        if inp.awaiting_sample:
            # their CPU is in the node's usage but not yet in theirs: it would count as system usage
            waited = inp.awaiting_sample
            out.skipped = (
                f"waiting for the first CPU sample of {len(waited)} BE pods: {', '.join(waited[:3])}"
            )
            return out
        capacity = inp.node.capacity.get("cpu", 0)
        non_be = self.non_be(inp.pods)
        pod_non_be, app_non_be, system = calculate_filter_pods_used(
            inp.node_used,
            inp.reserved_milli / 1000,
            inp.pods,
            inp.pod_used,
            cfg.host_apps,
            inp.host_app_used,
            lambda pod: non_be.get(pod.uid) is not False,
            lambda app: app.non_be,
            lambda app: app.name,
        )
        suppress = be_suppress_milli(
            capacity, cfg.threshold_percent, pod_non_be, app_non_be, system, cfg.min_percent
        )
        BE_SUPPRESS_LS_USED.set(pod_non_be + app_non_be + system)
        out.own_milli, out.floor_milli = suppress, suppress_floor(capacity, cfg)
        if inp.tighten_milli > 0:
            suppress = max(out.floor_milli, suppress - inp.tighten_milli)
        out.suppress_milli = suppress
        if not inp.processors:
            out.skipped = "node cpu info unavailable"
            return out
        if cfg.policy is Policy.CFS_QUOTA:
            out.writes += self.adjust_by_cfs_quota(inp, suppress, capacity)
            self.statuses[Policy.CFS_QUOTA] = Status.USING
            out.writes += self._recover_cpuset(inp, pod_cpusets, CONTAINER_DEPTH)
        else:
            out.writes += self.adjust_by_cpuset(inp, suppress, pod_cpusets)
            self.statuses[Policy.CPUSET] = Status.USING
            out.writes += self.recover_cfs_quota(inp)
        return out

    def settle(self, results: Sequence[WriteResult]) -> None:
        """After the round's writes: its groups (planned or found unchanged) are what landed; after any
        problem (a refused, failed or vanished write) nothing is: the next round plans everything again."""
        # only this round's groups: a group not planned now (the policy moved on) may have been overwritten
        ok = all(r.ok and r.outcome is not Outcome.VANISHED for r in results)
        self.landed = self._pending if ok else {}
        self._pending = {}

    def _unchanged(self, group: str, key: object) -> bool:
        """Whether `group` landed from `key` before (and this is not a full round); else it is pending."""
        self._pending[group] = key
        return not self._full and group in self.landed and self.landed[group] == key

    def non_be(self, pods: Mapping[str, PodInfo]) -> dict[str, bool]:
        """`non_be_pod` of every pod by uid, memoised per pods mapping (1,000 pods: ~1 ms each round)."""
        if self._non_be_of is not pods:
            self._non_be_flags = {uid: non_be_pod(pod) for uid, pod in pods.items()}
            self._non_be_of = pods
        return self._non_be_flags

    def _scheduler_cpusets(self, pods: Mapping[str, PodInfo]) -> dict[str, frozenset[int]]:
        """`scheduler_cpusets`, memoised per pods mapping (NodeState replaces it on every change)."""
        if self._cpusets_of is not pods:
            self._cpusets = scheduler_cpusets(pods)
            self._cpusets_of = pods
        return self._cpusets

    # -- cfs quota -------------------------------------------------------------------------------------------

    def adjust_by_cfs_quota(
        self, inp: SuppressInputs, suppress_milli: int, capacity_milli: int
    ) -> list[CgroupWrite]:
        """Set the besteffort quota to the suppress amount (bypass and step limits applied)."""
        if inp.be_quota is None or not inp.be_dirs:
            return []
        new = plan_cfs_quota(suppress_milli, inp.be_quota, capacity_milli)
        self.hysteresis.percent = inp.hysteresis_percent
        new = self.hysteresis.decide(new, quota_target(suppress_milli), inp.be_quota, capacity_milli)
        if new is None:
            # the cap in force stays: exported too (after a restart over a suppressed node nothing is written)
            if inp.be_quota != UNSET_QUOTA:
                BE_SUPPRESS_CORES.labels(Policy.CFS_QUOTA.value).set(inp.be_quota / CFS_PERIOD)
            return []
        BE_SUPPRESS_CORES.labels(Policy.CFS_QUOTA.value).set(new / CFS_PERIOD)
        return [
            CgroupWrite(
                inp.be_dirs[0].path,
                CFS_QUOTA,
                str(new),
                Level.QOS,
                cacheable=False,
                reason=REASON_ADJUST_BE_BY_NODE_CPU_USAGE,
            )
        ]

    def recover_cfs_quota(self, inp: SuppressInputs) -> list[CgroupWrite]:
        """recoverCFSQuotaIfNeed: write -1 once unless already recovered."""
        if self.statuses.get(Policy.CFS_QUOTA) is Status.RECOVERED or not inp.be_dirs:
            return []
        self.statuses[Policy.CFS_QUOTA] = Status.RECOVERED
        return [
            CgroupWrite(
                inp.be_dirs[0].path,
                CFS_QUOTA,
                str(UNSET_QUOTA),
                Level.QOS,
                cacheable=False,
                reason=REASON_UPDATE_CPU,
            )
        ]

    # -- cpuset ----------------------------------------------------------------------------------------------

    def _excluded(self, inp: SuppressInputs) -> frozenset[int]:
        return inp.reserved_cpus | inp.system_qos_exclusive

    def _lse_cpus(self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]) -> frozenset[int]:
        lse: set[int] = set()
        for uid, cpus in pod_cpusets.items():
            pod = inp.pods.get(uid)
            if pod is not None and pod.qos_raw is QoSClass.LSE:
                lse |= cpus
        return frozenset(lse)

    def be_cpuset(self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]) -> frozenset[int]:
        """The full BE cpuset used for recovery."""
        return recovery_cpuset(inp.processors, self._excluded(inp), self._lse_cpus(inp, pod_cpusets))

    def _recover_cpuset(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]], max_depth: int
    ) -> list[CgroupWrite]:
        """`recover_cpuset` unless the same recovery landed before."""
        if inp.processors:
            value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
            if self._unchanged("recover-cpuset", (max_depth, value, inp.be_dirs)):
                self.statuses[Policy.CPUSET] = Status.RECOVERED
                return []
        return self.recover_cpuset(inp, pod_cpusets, max_depth)

    def _recover_cpuset_for_be_cpu_manager(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """`recover_cpuset_for_be_cpu_manager` unless the same recovery landed before."""
        if inp.processors:
            value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
            bound = tuple(
                sorted(uid for uid in inp.pod_dirs if bound_by_scheduler(inp.pods.get(uid), pod_cpusets))
            )
            if self._unchanged("recover-cpuset-be-cpu-manager", (value, inp.be_dirs, bound)):
                self.statuses[Policy.CPUSET] = Status.RECOVERED
                return []
        return self.recover_cpuset_for_be_cpu_manager(inp, pod_cpusets)

    def recover_cpuset(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]], max_depth: int
    ) -> list[CgroupWrite]:
        """recoverCPUSetIfNeed: write the full BE cpuset to every BE dir down to `max_depth` (top-down)."""
        self.statuses[Policy.CPUSET] = Status.RECOVERED
        if not inp.processors:
            return []
        value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
        return [
            CgroupWrite(d.path, CPUSET_CPUS, value, level_of(d.depth), reason=REASON_UPDATE_CPU)
            for d in inp.be_dirs
            if d.depth <= max_depth
        ]

    def recover_cpuset_for_be_cpu_manager(
        self, inp: SuppressInputs, pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """Full BE cpuset everywhere except containers of pods the scheduler bound to CPUs or NUMA nodes."""
        self.statuses[Policy.CPUSET] = Status.RECOVERED
        if not inp.processors:
            return []
        value = format_cpuset(self.be_cpuset(inp, pod_cpusets))
        bound_dirs = [
            d for uid, d in inp.pod_dirs.items() if bound_by_scheduler(inp.pods.get(uid), pod_cpusets)
        ]
        writes = []
        for d in inp.be_dirs:
            if d.depth == CONTAINER_DEPTH and any(pd and pd in d.path for pd in bound_dirs):
                continue
            writes.append(
                CgroupWrite(d.path, CPUSET_CPUS, value, level_of(d.depth), reason=REASON_UPDATE_CPU)
            )
        return writes

    def adjust_by_cpuset(
        self, inp: SuppressInputs, suppress_milli: int, pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """Shrink (or grow, step-limited) the BE cpuset to ceil(suppress) CPUs from the LSR and LS pools."""
        if inp.be_cpuset is None:
            return []
        cpu_qos: dict[int, QoSClass] = {}
        for uid, cpus in pod_cpusets.items():
            pod = inp.pods.get(uid)
            if pod is None:
                continue
            for c in cpus:
                cpu_qos[c] = pod.qos_raw
        lsr, ls = cpu_pools(inp.processors, cpu_qos, self._excluded(inp))
        count = be_cpu_count(suppress_milli, len(inp.be_cpuset), len(inp.processors))
        picked = pick_suppressed_cpuset(count, lsr, ls)
        if not picked:
            # no usable CPU (both pools empty, or not enough in a pool): leave the BE cpusets as they are
            return []
        static = inp.cpu_manager_policy == "static"
        recovery = format_cpuset(self.be_cpuset(inp, pod_cpusets)) if static else ""
        key = (tuple(picked), inp.be_cpuset, inp.cpu_manager_policy, recovery, inp.be_dirs)
        if self._unchanged("apply-be-cpuset", key):
            BE_SUPPRESS_CORES.labels(Policy.CPUSET.value).set(len(set(picked)))
            if recovery:
                self.statuses[Policy.CPUSET] = Status.RECOVERED
            return []
        return self.apply_be_cpuset(inp, picked, pod_cpusets)

    def apply_be_cpuset(
        self, inp: SuppressInputs, picked: Sequence[int], pod_cpusets: Mapping[str, frozenset[int]]
    ) -> list[CgroupWrite]:
        """applyBESuppressCPUSet: static kubelet policy → containers only; else loosen down, set up."""
        new = format_cpuset(picked)
        BE_SUPPRESS_CORES.labels(Policy.CPUSET.value).set(len(set(picked)))
        reason = REASON_ADJUST_BE_BY_NODE_CPU_USAGE
        if inp.cpu_manager_policy == "static":
            writes = self.recover_cpuset(inp, pod_cpusets, POD_DEPTH)
            writes += [
                CgroupWrite(d.path, CPUSET_CPUS, new, level_of(d.depth), reason=reason)
                for d in inp.be_dirs
                if d.depth == CONTAINER_DEPTH
            ]
            return writes
        dirs = [d for d in inp.be_dirs if d.depth <= CONTAINER_DEPTH]
        merged = format_cpuset(set(inp.be_cpuset or ()) | set(picked))
        writes = [CgroupWrite(d.path, CPUSET_CPUS, merged, level_of(d.depth), reason=reason) for d in dirs]
        writes += [
            CgroupWrite(d.path, CPUSET_CPUS, new, level_of(d.depth), reason=reason) for d in reversed(dirs)
        ]
        return writes


class CPUSuppressStrategy:
    """The CPUSuppress strategy as the QoS manager runs it."""

    name = NAME

    def __init__(self) -> None:
        self.core = CPUSuppress()
        self.last_plan: SuppressPlan | None = None
        self._events: set[asyncio.Task[bool]] = set()
        self._next_full = float("-inf")
        # BE pods by uid → pod dir, for the pods mapping they were read from
        self._be_pods_of: Mapping[str, PodInfo] | None = None
        self._be_pod_dirs: dict[str, str] = {}
        self._be_key: tuple[tuple[str, tuple[str, ...]], ...] = ()
        # the BE dir walk and the BE pods (uid, container ids) it was made for (None: walk again)
        self._walked_for: tuple[tuple[str, tuple[str, ...]], ...] | None = None
        self._be_dirs: tuple[BEDir, ...] = ()
        self.walks = 0  # BE dir walks made (for tests and the benchmark)
        self.first_samples = FirstSampleWait()

    def enabled(self, config: AgentConfig) -> bool:
        """Gate BECPUSuppress and a positive interval."""
        return config.gate("BECPUSuppress") and config.qos.cpu_suppress_interval_seconds > 0

    def interval(self, config: AgentConfig) -> float:
        """--cpu-suppress-interval-seconds."""
        return config.qos.cpu_suppress_interval_seconds

    async def inputs(self, state: NodeState, env: StrategyEnv, full: bool) -> SuppressInputs:
        """`build_inputs` for a running strategy: yields in its loops over pods and dirs, and walks the BE
        dirs again only when the BE pods (or their containers) changed, a write found a dir gone, or in a
        full round (a dir made or removed behind our back is seen then)."""
        pace = Pace()
        store = env.store
        pods = state.pods
        samples = window_samples(env.config.qos.cpu_suppress_usage_window_seconds, env.collect_interval)
        node_used, pod_used = await suppress_usage_paced(store, pods, samples, pace)
        if self._be_pods_of is not pods:
            pod_dirs: dict[str, str] = {}
            key: list[tuple[str, tuple[str, ...]]] = []
            for uid, pod in pods.items():
                if pod.kube_qos is KubeQoS.BESTEFFORT:
                    key.append((uid, tuple(c.container_id for c in pod.containers)))
                    d = self._be_pod_dirs.get(uid) or env.pod_dir(pod)  # a pod's dir never moves
                    if d is not None:
                        pod_dirs[uid] = d
                await pace()
            self._be_pods_of, self._be_pod_dirs, self._be_key = pods, pod_dirs, tuple(sorted(key))
        if full or self._walked_for != self._be_key:
            self._be_dirs = tuple(await env.be_cpuset_dirs_paced(CONTAINER_DEPTH, pace))
            self._walked_for = self._be_key
            self.walks += 1
        wait = self.first_samples
        wait.rounds = env.config.qos.cpu_suppress_new_pod_wait_rounds
        non_be = self.core.non_be(pods)
        awaiting = wait.waiting(
            pods, lambda pod: non_be.get(pod.uid) is False, pod_used, env.clock(), env.collect_interval
        )
        return assemble_inputs(state, env, node_used, pod_used, self._be_dirs, self._be_pod_dirs, awaiting)

    async def run_once(self, state: NodeState, env: StrategyEnv) -> None:
        """Plan from the current state and metrics, then write through the executor.

        Every FULL_PASS_SECONDS the round is full: the dirs are walked and every write is planned again, so
        a cpuset changed behind our back is put back within that time (the executor compares with the file).
        """
        now = env.clock()
        full = now >= self._next_full
        if full:
            self._next_full = now + FULL_PASS_SECONDS
        inp = await self.inputs(state, env, full)
        await asyncio.sleep(0)  # the inputs and the plan are two slices
        plan = self.core.plan(inp, full=full)
        self.last_plan = plan
        env.tightening.suppress_milli, env.tightening.floor_milli = plan.own_milli, plan.floor_milli
        await asyncio.sleep(0)  # ... and the plan and the writes
        writes = plan.writes
        if full:  # re-check the files themselves, not the executor's cache of what it wrote
            writes = [replace(w, cacheable=False) for w in writes]
        results = await env.apply(NAME, writes)
        self.core.settle(results)
        if any(r.outcome is Outcome.VANISHED for r in results):
            self._walked_for = None  # a dir went away: walk again next round
        self._post_event(state, env, results)
        # A recovery is remembered as done only once its writes landed: a failed "-1" or full-cpuset write
        # would otherwise leave BE capped at the last suppressed value until the agent restarts.
        for r in results:
            if r.ok:
                continue
            policy = Policy.CFS_QUOTA if r.write.resource == "cpu.cfs_quota_us" else Policy.CPUSET
            if self.core.statuses.get(policy) is Status.RECOVERED:
                self.core.statuses[policy] = Status.USING

    def _post_event(self, state: NodeState, env: StrategyEnv, results: Sequence[WriteResult]) -> None:
        """An Event on the Node when the BE cap moved (posted off the round; rate-limited by the recorder)."""
        recorder, node, be_dir = env.events, state.node, env.be_dir()
        event = suppress_event(results, be_dir) if be_dir is not None else None
        if recorder is None or node is None or event is None:
            return
        task = asyncio.create_task(recorder.record(node_reference(node.name, node.uid), "Normal", *event))
        self._events.add(task)
        task.add_done_callback(self._events.discard)
