"""Colocation on the real kernel: LS probe latency alone, next to BE burners, and with CPU suppress.

The workload is the demo's (`koordqos.demo.workload`): by default memory-bound LS probes pinned to their
own CPU (`--ls-cpus 1`) and BE memory streamers on the others, so that CFS shares cannot help
(`--probe-mode cpu --be-mode spin --ls-cpus 0` is the CPU-only, unpinned variant).

The demo's experiment (`python -m koordqos demo`) built to survive a noisy machine:
* a scratch pod tree on the real cgroup hierarchy whose root gets a large cpu.shares (`--root-shares`), so
  the rest of the machine does not starve the probes; the probes, burners, this process and the agents all
  run inside it;
* the phases are interleaved and repeated: every round runs each phase once, in an order rotated by one
  each round, and the first `--settle` seconds of a phase are not measured;
* the agents are started once and frozen (SIGSTOP) outside their own phase, so a phase without an agent
  has no agent at all; each agent phase starts from an unlimited quota and counts the agent's own CPU;
* per round: LS p50/p99, BE CPU, quota, quota writes, the ratios with agent / alone and with agent /
  hand-set quota; over the rounds: medians. The load average and the CPU used outside the scratch tree are
  reported with every round.

Phases: `alone` (LS only), `no-agent` (LS + BE), `hand-set` (LS + BE, the quota fixed by hand at koordlet's
formula with the LS usage of the round's `alone` phase: capacity × threshold − LS), `agent-1s` (the agent at
1 s, project defaults), `agent-0.1s` (0.1 s, project defaults), `agent-0.1s-koordlet` (0.1 s,
`--cpu-suppress-usage-window-seconds=0 --cpu-suppress-hysteresis-percent=0`: koordlet's planner),
`agent-psi` (1 s, the PSI rule instead of static suppress: gate PSIInterference, docs/psi.md, with the
suppress threshold at 100 % so that the quota is what the rule's tightening makes of it).

Every phase also gives the LS pod's CPU stall fraction (the kernel's PSI `some` total over the phase, from
the pod's cpu.pressure: cgroup v2, or the unified mirror of a hybrid v1 node; none on plain v1) and the PSI
rule's decisions.

Run as root: `python bench/colocation.py [--rounds 5] [--phase-seconds 12]`; `--out` writes the JSON
figures and the chart (PNG).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import machine, parser, percentile, table
from koordqos.demo.agentproc import GATES, SUPPRESS, AgentProcess, write_nodeslo
from koordqos.demo.cgtree import CFS_PERIOD, unavailable_reason
from koordqos.demo.exitguard import ExitGuard, Interrupted
from koordqos.demo.nripods import demo_pods
from koordqos.demo.realnode import RealNode
from koordqos.demo.workload import BurnArgs, ProbeArgs, calibrate, split_cpus
from koordqos.testing.mock_nri.runtime import MockRuntime

THRESHOLD = 65
KOORDLET_FLAGS = ("--cpu-suppress-usage-window-seconds", "0", "--cpu-suppress-hysteresis-percent", "0")
AGENTS = {  # phase → (interval, extra flags, suppress threshold %)
    "agent-1s": (1.0, (), THRESHOLD),
    "agent-0.1s": (0.1, (), THRESHOLD),
    "agent-0.1s-koordlet": (0.1, KOORDLET_FLAGS, THRESHOLD),
    "agent-psi": (1.0, (f"--feature-gates={GATES},PSIInterference=true",), 100),
}
PHASES = ("alone", "no-agent", "hand-set", *AGENTS)


@dataclass
class PhaseRun:
    """One phase of one round."""

    phase: str
    round: int
    lat_ms: list[float] = field(default_factory=list)
    ls_cores: float = 0.0
    be_cores: float = 0.0
    outside_cores: float = 0.0  # CPU used on the machine outside the scratch tree
    quotas: list[int] = field(default_factory=list)
    quota_writes: int = 0
    agent_cores: float | None = None
    loadavg: float = 0.0
    ls_stall: float | None = None  # the LS pod's CPU "some" stall fraction over the phase (PSI)
    psi_actions: int = 0  # the PSI rule's decisions in the phase

    def figures(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "round": self.round,
            "samples": len(self.lat_ms),
            "p50_ms": percentile(self.lat_ms, 50),
            "p99_ms": percentile(self.lat_ms, 99),
            "ls_cores": round(self.ls_cores, 3),
            "be_cores": round(self.be_cores, 3),
            "outside_cores": round(self.outside_cores, 3),
            "quota_median": statistics.median(self.quotas) if self.quotas else None,
            "quota_min": min(self.quotas) if self.quotas else None,
            "quota_max": max(self.quotas) if self.quotas else None,
            "quota_writes": self.quota_writes,
            "agent_cores": None if self.agent_cores is None else round(self.agent_cores, 4),
            "loadavg1": self.loadavg,
            "ls_stall": None if self.ls_stall is None else round(self.ls_stall, 4),
            "psi_actions": self.psi_actions,
        }


def host_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Bench:
    def __init__(self, node: RealNode, workdir: Path, args: Any) -> None:
        self.node = node
        self.workdir = workdir
        self.args = args
        self.agents: dict[str, AgentProcess] = {}
        self.runtimes: list[MockRuntime] = []
        self.alone_ls: float | None = None

    async def start_agents(self) -> None:
        for phase, (interval, extra, threshold) in AGENTS.items():
            spec = self.node.agent_spec(interval, name=phase, extra_args=extra)
            write_nodeslo(spec.nodeslo_file, threshold)
            runtime = MockRuntime(spec.nri_socket, runtime_name="containerd")
            runtime.pods, runtime.containers = demo_pods(self.args.ls_request_milli)
            await runtime.start()
            self.runtimes.append(runtime)
            agent = AgentProcess(spec)
            await agent.start()
            await agent.wait_ready(120)
            agent.pause()
            self.agents[phase] = agent

    async def stop(self) -> None:
        for agent in self.agents.values():
            await agent.stop()
        for runtime in self.runtimes:
            await runtime.stop()

    def hand_set_quota(self) -> int:
        ls = self.alone_ls if self.alone_ls is not None else self.args.ls_request_milli / 1000
        return max(2000, int((self.node.cpus * THRESHOLD / 100 - ls) * CFS_PERIOD))

    async def phase(self, phase: str, rnd: int) -> PhaseRun:
        node, args = self.node, self.args
        burners = phase != "alone"
        if burners:
            await node.start_burners(args.burners, args.burn)
        node.set_be_quota(self.hand_set_quota() if phase == "hand-set" else -1)
        agent = self.agents.get(phase)
        if agent is not None:
            await agent.new_decisions((SUPPRESS, "PSIInterference"))  # forget those of earlier rounds
            agent.resume()
        await asyncio.sleep(args.settle)  # transients (burner start, the agent's first rounds) not measured
        run = PhaseRun(phase, rnd, loadavg=os.getloadavg()[0])
        node.drain_latencies()
        ls0, be0, _ = node.read()
        stall0 = node.ls_cpu_stall_us()
        host0, t0 = host_busy_seconds(), time.monotonic()
        cpu0 = agent.cpu_seconds() if agent is not None else 0.0
        end = t0 + args.phase_seconds
        while time.monotonic() < end:
            await asyncio.sleep(0.1)
            run.quotas.append(node.read()[2])
            if agent is not None:
                decisions = await agent.new_decisions((SUPPRESS, "PSIInterference"))
                run.quota_writes += sum(
                    1 for d in decisions if d["action"] == "write" and "quota" in d["target"]
                )
                run.psi_actions += sum(1 for d in decisions if d.get("strategy") == "PSIInterference")
        ls1, be1, _ = node.read()
        stall1 = node.ls_cpu_stall_us()
        dt = time.monotonic() - t0
        if stall0 is not None and stall1 is not None:
            run.ls_stall = max(0.0, (stall1 - stall0) / 1e6 / dt)
        run.lat_ms = [s / 1000 for s in node.drain_latencies()]
        run.ls_cores, run.be_cores = (ls1 - ls0) / dt, (be1 - be0) / dt
        scratch = run.ls_cores + run.be_cores
        if agent is not None:
            run.agent_cores = (agent.cpu_seconds() - cpu0) / dt
            scratch += run.agent_cores
            agent.pause()
        run.outside_cores = max(0.0, (host_busy_seconds() - host0) / dt - scratch)
        if burners:
            await node.stop_burners()
        if phase == "alone":
            self.alone_ls = run.ls_cores
        return run


async def run_bench(args: Any, workdir: Path, guard: ExitGuard) -> list[PhaseRun]:
    node = RealNode(workdir, guard, root_shares=args.root_shares)
    node.setup(args.ls_request_milli)
    ls_cpus, own_cpus = split_cpus(node.cpu_ids, args.ls_cpus)
    pinned = ls_cpus != own_cpus
    if pinned:
        node.pin_demo(own_cpus)  # and so the agents; the probes pin themselves to ls_cpus
    args.burn = BurnArgs(args.be_mode, args.be_buffer_mib, tuple(own_cpus) if pinned else ())
    print(
        f"scratch tree {node.tree.name}, {node.cpus} CPUs (LS on {ls_cpus}, BE on {own_cpus}), "
        f"cgroup {node.cgroup_version}",
        flush=True,
    )
    iterations = await asyncio.to_thread(
        calibrate, args.work_ms, args.probe_mode, args.buffer_mib, 15, args.period_ms
    )
    bench = Bench(node, workdir, args)
    runs: list[PhaseRun] = []
    try:
        probe = ProbeArgs(
            args.probe_mode, iterations, args.period_ms, args.buffer_mib, tuple(ls_cpus) if pinned else ()
        )
        await node.start_probes(args.probes, probe)
        await bench.start_agents()
        for rnd in range(args.rounds):
            order = list(PHASES[rnd % len(PHASES) :] + PHASES[: rnd % len(PHASES)])
            if "alone" in order:  # the hand-set quota needs this round's LS usage: alone before hand-set
                a, h = order.index("alone"), order.index("hand-set")
                if a > h:
                    order[a], order[h] = order[h], order[a]
            for phase in order:
                run = await bench.phase(phase, rnd)
                runs.append(run)
                f = run.figures()
                print(
                    f"round {rnd + 1} {phase:<20} p50 {f['p50_ms']:.2f} p99 {f['p99_ms']:.2f} ms "
                    f"LS {f['ls_cores']:.2f} BE {f['be_cores']:.2f} outside {f['outside_cores']:.2f} cores "
                    f"quota {f['quota_median']} writes {f['quota_writes']} load {f['loadavg1']:.2f} "
                    f"LS stall {f['ls_stall']} PSI decisions {f['psi_actions']}",
                    flush=True,
                )
    finally:
        await bench.stop()
        await node.stop()
    return runs


def summarize(runs: list[PhaseRun]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r.phase, []).append(r.figures())
    rounds = sorted({r.round for r in runs})

    def p99(phase: str, rnd: int) -> float:
        return next(f["p99_ms"] for f in by[phase] if f["round"] == rnd)

    ratios = {
        f"{agent}/{base}": [round(p99(agent, r) / p99(base, r), 3) for r in rounds]
        for agent in (*AGENTS, "no-agent")
        for base in ("alone", "hand-set")
    }
    medians = {
        phase: {
            k: statistics.median([f[k] for f in fs if f[k] is not None])
            for k in ("p50_ms", "p99_ms", "be_cores", "ls_cores", "outside_cores", "quota_writes", "loadavg1")
        }
        | {
            k: statistics.median(vs) if (vs := [f[k] for f in fs if f[k] is not None]) else None
            for k in ("ls_stall", "psi_actions")
        }
        | {
            "agent_cores": statistics.median([f["agent_cores"] for f in fs])
            if fs[0]["agent_cores"] is not None
            else None
        }
        for phase, fs in by.items()
    }
    return {
        "per_phase_round": by,
        "ratios_per_round": ratios,
        "medians": medians,
        "median_ratios": {k: statistics.median(v) for k, v in ratios.items()},
    }


def chart(summary: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for phase in PHASES:
        fs = summary["per_phase_round"][phase]
        ax.plot([f["round"] + 1 for f in fs], [f["p99_ms"] for f in fs], marker="o", label=phase)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("LS p99 latency, ms")
    ax.legend(fontsize=8)
    med = summary["medians"]
    ax2.bar(range(len(PHASES)), [med[p]["be_cores"] for p in PHASES], color="#ef6c00")
    ax2.set_xticks(range(len(PHASES)), PHASES, rotation=25, fontsize=8)
    ax2.set_ylabel("BE CPU, cores (median)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--phase-seconds", type=float, default=12.0)
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--probes", type=int, default=2)
    p.add_argument("--work-ms", type=float, default=1.0)
    p.add_argument("--period-ms", type=float, default=5.0)
    p.add_argument("--probe-mode", choices=("memory", "cpu"), default="memory")
    p.add_argument("--buffer-mib", type=int, default=16)
    p.add_argument("--burners", type=int, default=2)
    p.add_argument("--be-mode", choices=("stream", "spin"), default="stream")
    p.add_argument("--be-buffer-mib", type=int, default=64)
    p.add_argument("--ls-cpus", type=int, default=1, help="CPUs the probes are pinned to (0: no pinning)")
    p.add_argument("--root-shares", type=int, default=262144)
    p.add_argument("--out", type=Path, default=None, help="directory for colocation.json and colocation.png")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.phase_seconds, args.settle = 1, 3.0, 1.0
    args.ls_request_milli = round(args.probes * args.work_ms / args.period_ms * 1000)
    reason = unavailable_reason()
    if reason:  # not an error for `nox -s bench` on a machine without root: say why and skip
        print(f"colocation benchmark skipped: it needs the real kernel ({reason})")
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="kqbench-", dir="/tmp"))
    load_start = os.getloadavg()
    with ExitGuard() as guard:
        guard.push(f"remove {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
        try:
            runs = asyncio.run(run_bench(args, workdir, guard))
        except Interrupted:
            print("interrupted: scratch cgroups removed")
            return 130
    load_end = os.getloadavg()
    summary = summarize(runs)
    rows = []
    for phase in PHASES:
        m = summary["medians"][phase]
        agent = "" if m["agent_cores"] is None else f"{m['agent_cores'] * 100:.2f} %"
        rows.append(
            [
                phase,
                f"{m['p50_ms']:.2f}",
                f"{m['p99_ms']:.2f}",
                f"{m['be_cores']:.2f}",
                f"{m['quota_writes']:g}",
                agent,
                f"{m['outside_cores']:.2f}",
                "–" if m["ls_stall"] is None else f"{m['ls_stall'] * 100:.1f} %",
                f"{m['psi_actions']:g}",
            ]
        )
    print()
    print(
        f"{machine()}; {args.rounds} rounds × {args.phase_seconds:g} s per phase (+{args.settle:g} s settle)"
    )
    start, end = (" ".join(f"{v:.2f}" for v in load) for load in (load_start, load_end))
    print(f"load average start {start}, end {end}")
    print(
        table(
            rows,
            [
                "phase",
                "LS p50 ms",
                "LS p99 ms",
                "BE cores",
                "quota writes",
                "agent CPU",
                "outside",
                "LS CPU stall",
                "PSI rule decisions",
            ],
        )
    )
    for k, v in summary["ratios_per_round"].items():
        if k.startswith("agent") or k == "no-agent/alone":
            print(f"p99 {k:<30} per round {v}  median {summary['median_ratios'][k]:.2f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": machine(),
            "load_start": load_start,
            "load_end": load_end,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        } | summary
        (args.out / "colocation.json").write_text(json.dumps(doc, indent=1) + "\n")
        chart(
            summary,
            args.out / "colocation.png",
            f"bench/colocation.py: {args.rounds} rounds, load average {load_start[0]:.1f}–{load_end[0]:.1f}",
        )
        print(f"figures: {args.out / 'colocation.json'}, chart: {args.out / 'colocation.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
