"""The demo's flags (`python -m koordqos demo --help`) and their typed form."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DemoOptions:
    """Everything a demo run is configured by."""

    synthetic: bool = False
    phase_seconds: float = 20.0
    interval: float = 1.0  # the agent's collect and CPU-suppress interval
    sample_interval: float = 0.25
    probes: int = 3
    burners: int = 2
    work_ms: float = 1.0
    period_ms: float = 2.5
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
    p.add_argument("--work-ms", type=_positive_float, default=d.work_ms, help="CPU work per probe slot")
    p.add_argument("--period-ms", type=_positive_float, default=d.period_ms, help="probe slot length")
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
        help="cpu.shares of the scratch tree's root (default: the kernel's 1024)",
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
        interval=args.interval,
        sample_interval=args.sample_interval,
        probes=args.probes,
        burners=args.burners,
        work_ms=args.work_ms,
        period_ms=args.period_ms,
        threshold_percent=args.threshold,
        synthetic_cpus=args.synthetic_cpus,
        root_shares=args.root_shares,
        out=args.out,
        live=not args.no_live,
        agent_args=tuple(args.agent_arg),
    )
