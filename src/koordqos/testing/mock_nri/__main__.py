"""`python -m koordqos.testing.mock_nri --socket PATH [--scenario NAME --node-dir DIR]`: serve plugins pods.

Without `--scenario`: `--pods` sample best-effort pods (for benchmarks). With `--scenario colocation`: LS, LSR
and BE-with-batch pods on a synthetic node directory created under `--node-dir`; the command to run the agent
against it is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_node
from koordqos.testing.mock_nri.scenarios import SCENARIOS


async def _serve(args: argparse.Namespace) -> None:
    rt = MockRuntime(args.socket, request_timeout=args.request_timeout)
    if args.scenario:
        scenario = SCENARIOS[args.scenario](Path(args.node_dir))
        rt.pods, rt.containers = scenario.pods, scenario.containers
    else:
        rt.pods, rt.containers = sample_node(args.pods, args.containers_per_pod)
    async with rt:
        print(f"mock NRI runtime listening on {args.socket}", flush=True)
        if args.scenario:
            print(
                f"scenario {scenario.name}: synthetic node in {args.node_dir}; run the agent with:",
                flush=True,
            )
            print("  " + scenario.agent_command(args.socket), flush=True)
            print("then look at http://127.0.0.1:9316/debug/decisions for:", flush=True)
            for line in scenario.what_to_look_for:
                print("  - " + line, flush=True)
        seen = 0
        while True:
            link = await rt.wait_joined(timeout=3600, after=seen)
            seen = rt.links.index(link) + 1
            print(
                f"plugin {link.index}-{link.name} joined: events={link.events:#x} "
                f"sync={link.sync_seconds * 1000:.1f} ms updates={len(link.sync_updates)}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    """`python -m koordqos.testing.mock_nri --socket PATH`: serve plugins with a synthetic node."""
    p = argparse.ArgumentParser(
        prog="python -m koordqos.testing.mock_nri", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--socket", required=True)
    p.add_argument("--pods", type=int, default=10)
    p.add_argument("--containers-per-pod", type=int, default=2)
    p.add_argument("--request-timeout", type=float, default=2.0)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), help="serve a demo scenario instead of --pods")
    p.add_argument(
        "--node-dir", default="/tmp/koordqos-demo", help="where --scenario creates its synthetic node"
    )
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
