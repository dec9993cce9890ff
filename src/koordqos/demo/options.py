"""The demo's flags (`python -m koordqos demo --help`) and their typed form."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from koordqos.demo.workload import BURN_MODES, PROBE_MODES


@dataclass(frozen=True)
class DemoOptions:
    """Everything a demo run is configured by."""

    synthetic: bool = False
    phase_seconds: float = 8.0  # measured, per phase and round
    settle_seconds: float = 3.0  # before each measured phase: not measured (burner start, agent resume)
    warmup_seconds: float = 5.0  # the agent's first seconds after it is ready: not measured
    rounds: int = 3  # every round runs each phase once, in an order rotated by one each round
    interval: float = 1.0  # the agent's collect and CPU-suppress interval
    sample_interval: float = 0.25
    probes: int = 2
    burners: int = 2
    work_ms: float = 1.0
    period_ms: float = 5.0
    probe_mode: str = "memory"
    buffer_mib: int = 16
    be_mode: str = "stream"
    be_buffer_mib: int = 64
    ls_cpus: int = 1  # CPUs the LS probes are pinned to; BE and the demo get the others (0: no pinning)
    threshold_percent: int = 65
    synthetic_cpus: int = 4
    root_shares: int | None = None
    out: Path = Path("koordqos-demo-report")
    live: bool = True
    agent_ready_timeout: float = 60.0
    agent_args: tuple[str, ...] = ()  # extra `koordqos run` flags, e.g. koordlet's planner

    @property
    def ls_request_milli(self) -> int:
        """The LS pod's CPU request: what its probes use."""
        return max(1, round(self.probes * self.work_ms / self.period_ms * 1000))


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_flags(p: argparse.ArgumentParser) -> None:
    """Add the demo's flags to a (sub)parser."""
    d = DemoOptions()
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="run on a synthetic node with simulated usage (no root needed; decisions, not latency)",
    )
    p.add_argument(
        "--phase-seconds", type=_positive_float, default=d.phase_seconds, help="length of each phase"
    )
    p.add_argument(
        "--settle-seconds",
        type=_non_negative_float,
        default=d.settle_seconds,
        help="unmeasured seconds before each phase (BE starting, the agent resuming)",
    )
    p.add_argument(
        "--warmup-seconds",
        type=_non_negative_float,
        default=d.warmup_seconds,
        help="the agent's unmeasured first seconds after it is ready",
    )
    p.add_argument("--rounds", type=_positive_int, default=d.rounds, help="rounds of the three phases")
    p.add_argument(
        "--interval",
        type=_positive_float,
        default=d.interval,
        help="the agent's metrics and CPU-suppress interval in seconds",
    )
    p.add_argument(
        "--sample-interval", type=_positive_float, default=d.sample_interval, help="demo sampling period"
    )
    p.add_argument("--probes", type=_positive_int, default=d.probes, help="LS probe processes")
    p.add_argument("--burners", type=_positive_int, default=d.burners, help="BE burner processes")
    p.add_argument("--work-ms", type=_positive_float, default=d.work_ms, help="work per probe slot")
    p.add_argument("--period-ms", type=_positive_float, default=d.period_ms, help="probe slot length")
    p.add_argument(
        "--probe-mode",
        choices=PROBE_MODES,
        default=d.probe_mode,
        help="memory: random reads over a buffer bigger than L2; cpu: a loop in the core's own caches",
    )
    p.add_argument("--buffer-mib", type=_positive_int, default=d.buffer_mib, help="the memory probe's buffer")
    p.add_argument(
        "--be-mode",
        choices=BURN_MODES,
        default=d.be_mode,
        help="stream: copy a large buffer (memory bandwidth, shared cache); spin: CPU only",
    )
    p.add_argument(
        "--be-buffer-mib", type=_positive_int, default=d.be_buffer_mib, help="the BE streamers' buffer"
    )
    p.add_argument(
        "--ls-cpus",
        type=_non_negative_int,
        default=d.ls_cpus,
        help="CPUs the LS probes are pinned to; BE runs on the others (0: no pinning)",
    )
    p.add_argument(
        "--threshold", type=_positive_int, default=d.threshold_percent, help="cpuSuppressThresholdPercent"
    )
    p.add_argument(
        "--synthetic-cpus", type=_positive_int, default=d.synthetic_cpus, help="CPUs of the synthetic node"
    )
    p.add_argument(
        "--root-shares",
        type=_positive_int,
        default=None,
        help="cpu.shares of the scratch tree's root (default: the kernel's 1024); a large one (262144) keeps "
        "the rest of a busy machine from starving the demo's pods",
    )
    p.add_argument("--out", type=Path, default=d.out, help="directory for the report (JSON and PNG)")
    p.add_argument("--no-live", action="store_true", help="print plain lines instead of the live view")
    p.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for the agent, repeatable (e.g. --agent-arg=--cpu-suppress-hysteresis-percent=0)",
    )


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    """DemoOptions from parsed flags."""
    return DemoOptions(
        synthetic=args.synthetic,
        phase_seconds=args.phase_seconds,
        settle_seconds=args.settle_seconds,
        warmup_seconds=args.warmup_seconds,
        rounds=args.rounds,
        interval=args.interval,
        sample_interval=args.sample_interval,
        probes=args.probes,
        burners=args.burners,
        work_ms=args.work_ms,
        period_ms=args.period_ms,
        probe_mode=args.probe_mode,
        buffer_mib=args.buffer_mib,
        be_mode=args.be_mode,
        be_buffer_mib=args.be_buffer_mib,
        ls_cpus=args.ls_cpus,
        threshold_percent=args.threshold,
        synthetic_cpus=args.synthetic_cpus,
        root_shares=args.root_shares,
        out=args.out,
        live=not args.no_live,
        agent_args=tuple(args.agent_arg),
    )
