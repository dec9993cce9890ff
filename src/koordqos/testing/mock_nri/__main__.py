"""`python -m koordqos.testing.mock_nri --socket PATH`: serve plugins a synthetic node."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from koordqos.testing.mock_nri.runtime import MockRuntime
from koordqos.testing.mock_nri.samples import sample_node


async def _serve(args: argparse.Namespace) -> None:
    rt = MockRuntime(args.socket, request_timeout=args.request_timeout)
    rt.pods, rt.containers = sample_node(args.pods, args.containers_per_pod)
    async with rt:
        print(f"mock NRI runtime listening on {args.socket}", flush=True)
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
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
