"""Command line: `koordqos run | report --once | version | config validate FILE | demo`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from koordqos import __version__
from koordqos.config import build_config
from koordqos.configload import add_flags, load_config, read_config_file
from koordqos.errors import ConfigError, KoordQoSError, ModelError


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The full CLI parser (also used by tests to check the Helm chart's args)."""
    parser = _Parser(prog="koordqos", description="koordqos node agent")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, required=True)
    run = sub.add_parser("run", help="run the agent")
    add_flags(run)
    rep = sub.add_parser("report", help="print the NodeMetric status and NRT the agent would write (JSON)")
    rep.add_argument(
        "--once", action="store_true", required=True, help="one report, printed, nothing written"
    )
    rep.add_argument("--rounds", type=int, default=3, help="metric collection rounds before reporting")
    add_flags(rep)
    sub.add_parser("version", help="print the version")
    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", parser_class=_Parser, required=True)
    val = cfg_sub.add_parser("validate", help="validate a NodeSLO or agent config file")
    val.add_argument("file", type=Path)
    cfg_sub.add_parser("flags", help="print every flag, its environment variable and default (Markdown)")
    from koordqos.demo.options import add_flags as add_demo_flags

    demo = sub.add_parser("demo", help="watch CPU suppress protect LS latency (needs koordqos[demo])")
    add_demo_flags(demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    try:
        given, ignored = koordlet_terms(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"koordqos: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(given)
    try:
        if args.command == "version":
            from koordqos.build import describe

            print(f"koordqos {__version__}, {describe()}")
            return 0
        if args.command == "config":
            if args.config_command == "flags":
                from koordqos.configflags import flags_markdown

                print(flags_markdown(), end="")
                return 0
            return validate_file(args.file)
        if args.command == "demo":
            from koordqos.demo.main import run as run_demo
            from koordqos.demo.options import options_from_args

            return run_demo(options_from_args(args))
        if args.command == "report":
            return report_once(args)
        return run_agent(args, ignored)
    except KoordQoSError as exc:
        print(f"koordqos: error: {exc}", file=sys.stderr)
        return 2


#: top-level keys that make a file a NodeSLO document (an object, a bare spec or a ConfigMap given instead)
_NODESLO_KEYS = frozenset(
    {
        "kind",
        "apiVersion",
        "spec",
        "data",
        "resourceUsedThresholdWithBE",
        "resourceQOSStrategy",
        "cpuBurstStrategy",
        "systemStrategy",
        "extensions",
        "hostApplications",
    }
)


def validate_file(path: Path) -> int:
    """Validate a NodeSLO (an object or a bare spec) or an AgentConfig file; print `ok` or precise errors.

    A NodeSLO goes through the agent's own validator (`validate_nodeslo`): what it reports here is what the
    agent refuses to apply. Unknown keys are errors here too (the agent warns and ignores them: a cluster may
    carry newer CRD fields; in a file being checked they are mistakes)."""
    from koordqos.model.nodeslo_lint import nodeslo_unknown_keys
    from koordqos.model.nodeslo_validate import validate_nodeslo

    tree: Any = read_config_file(path)
    if not tree:
        raise ConfigError(f"{path}: empty file: expected a NodeSLO or an agent config")
    if _NODESLO_KEYS.intersection(tree):
        try:
            verdict = validate_nodeslo(tree)
        except ModelError as exc:  # not a NodeSLO at all (kind, apiVersion, the slo-controller-config)
            raise ConfigError(f"{path}: {exc}") from None
        problems = [p.describe() for p in verdict.problems]
        problems += [f.describe() for f in nodeslo_unknown_keys(tree)]
        if problems:
            raise ConfigError(f"{path}: invalid NodeSLO: " + "; ".join(problems))
        print(f"{path}: valid NodeSLO")
        return 0
    try:
        build_config(tree)
    except ConfigError as exc:
        raise ConfigError(f"{path}: invalid agent config: {exc}") from None
    print(f"{path}: valid agent config")
    return 0


def report_once(args: argparse.Namespace) -> int:
    """`report --once`: collect a few rounds and print both planned objects as JSON; writes nothing."""
    import json

    from koordqos.agent import cluster_mode_available
    from koordqos.logging import configure_logging
    from koordqos.report.once import report_once as plan

    cfg = load_config(args)
    configure_logging("console" if cfg.log.format == "auto" else cfg.log.format, "warning")
    doc = asyncio.run(plan(cfg, cluster_mode_available(cfg), rounds=args.rounds))
    print(json.dumps(doc, indent=2, sort_keys=False))
    return 0


def koordlet_terms(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`run` and `report` arguments as koordlet's DaemonSet writes them, in koordqos's terms
    (`koordletargs.translate`), and the koordlet flags given that have no effect."""
    from koordqos.configflags import FLAGS
    from koordqos.koordletargs import translate

    if not argv or argv[0] not in ("run", "report"):
        return list(argv), []
    done = translate(argv[1:], {f.name for f in FLAGS})
    return [argv[0], *done.argv], done.ignored


def run_agent(args: argparse.Namespace, ignored: Sequence[str] = ()) -> int:
    """Load config, set up logging, run the agent until SIGTERM/SIGINT."""
    import structlog

    from koordqos.agent import Agent, loop_factory
    from koordqos.agent import run as run_on_loop
    from koordqos.logging import configure_logging

    cfg = load_config(args)
    loop_factory(cfg.event_loop)  # an unavailable loop is a ConfigError before anything starts
    configure_logging(cfg.log.format, cfg.log.level)
    agent = Agent(cfg)
    agent.build()
    if ignored:  # accepted so a koordlet DaemonSet's arguments start koordqos; listed once
        structlog.get_logger("koordqos.cli").warning(
            "koordlet flags with no effect in koordqos", flags=list(ignored)
        )
    run_on_loop(agent)
    return 0


__all__ = ["build_parser", "main"]
