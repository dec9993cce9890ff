"""Event bus: publish→handled throughput; and the hook core: one runtime call with 6 hooks."""

from __future__ import annotations

import asyncio
import os
import time

from _common import machine, median, parser, percentile, run, table
from koordqos.bus import EventBus
from koordqos.events.types import PodUpserted
from koordqos.hooks.context import PodContext, PodRequest, Stage
from koordqos.hooks.core import run_call, run_stage
from koordqos.hooks.framework import HookRegistry
from koordqos.model.pod import PodInfo
from koordqos.state import NodeState


async def throughput(n: int, subscribers: int) -> float:
    """Events per second from publish until every subscriber handled all of them."""
    bus = EventBus(queue_size=4096)
    done = asyncio.Event()
    counts = [0] * subscribers

    for i in range(subscribers):

        def handler(event: PodUpserted, state: NodeState, i: int = i) -> None:
            counts[i] += 1
            if all(c == n for c in counts):
                done.set()

        bus.subscribe(f"s{i}", handler, PodUpserted)
    runner = asyncio.create_task(bus.run())
    pods = [PodInfo(uid=f"u{i % 200}", name=f"p{i % 200}") for i in range(n)]
    await asyncio.sleep(0)
    start = time.perf_counter()
    for p in pods:
        await bus.publish(PodUpserted(p))
    await done.wait()
    elapsed = time.perf_counter() - start
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    return n / elapsed


async def request_latency(n: int) -> list[float]:
    """Round-trip seconds of one hook-core call (run_call + run_stage) with 6 small hooks."""
    registry = HookRegistry()
    stage = Stage.PRE_CREATE_CONTAINER
    for i in range(6):

        def hook(ctx: PodContext, i: int = i) -> None:
            res = ctx.response.resources
            res.cpu_shares = max(res.cpu_shares or 0, 2 + i)
            res.cfs_quota = (res.cfs_quota or 0) + 1000

        registry.register(stage, f"hook{i}", "", hook)
    samples = []
    for _ in range(n):
        ctx = PodContext(PodRequest(uid="u"))
        t0 = time.perf_counter()
        await run_call("Create", 1.0, "Ignore", lambda call, ctx=ctx: run_stage(registry, call, stage, ctx))
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    n = 2000 if args.quick else 20000
    runs = 1 if args.quick else args.runs
    tp1 = median([run(throughput(n, 1), args.loop) for _ in range(runs)])
    tp6 = median([run(throughput(n, 6), args.loop) for _ in range(runs)])
    lat = [run(request_latency(n // 2), args.loop) for _ in range(runs)]
    p50 = median([percentile(s, 50) for s in lat]) * 1e6
    p99 = median([percentile(s, 99) for s in lat]) * 1e6
    load = os.getloadavg()
    print(
        f"machine: {machine()}; {runs} run(s), median, {args.loop} loop; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        table(
            [
                ["publish→handled, 1 subscriber", f"{tp1:,.0f} events/s"],
                ["publish→handled, 6 subscribers", f"{tp6:,.0f} events/s (each delivered 6×)"],
                ["runtime call, 6 hooks, p50", f"{p50:.1f} µs"],
                ["runtime call, 6 hooks, p99", f"{p99:.1f} µs"],
            ],
            ["measure", "value"],
        )
    )


if __name__ == "__main__":
    main()
