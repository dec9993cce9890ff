"""Long fuzz run (outside CI): mutated NRI requests and proxy messages against the agent subprocess.

    .venv/bin/python bench/fuzz.py --nri 1000000 --proxy 100000 [--concurrency 8] [--seed 1] [--json]

The agent runs in local mode on the colocation scenario's synthetic node (tests.support.fuzz). Every NRI
request is a valid plugin-service request of that scenario with 1-4 byte mutations of its protobuf payload,
in an intact ttrpc/mux frame (so the agent must answer each one); every `--stream-break-every`-th request
instead breaks the byte stream itself (a frame header announcing more than the mux limit), after which the
plugin must reconnect. Proxy messages are mutated RuntimeHookService requests over grpc (unix socket).
Afterwards a valid session runs (CreateContainer for the batch pod must carry its batch shares and memory
limit; every proxy seed must answer OK). Reported: outcomes, crashes (agent exited), hangs (no answer within
the timeout), RSS and open fds of the agent at the start, every 10 %, and at the end (vitals: request index,
VmRSS KiB, fds, RssAnon KiB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import machine
from koordqos.nri.api import nri_api_pb2 as api
from tests.support.fuzz import FuzzTarget, Mutator, nri_seeds, proxy_call, proxy_seeds

#: A mux frame header for conn 1 announcing 4 GiB: past the frame limit, the byte stream cannot be resynced.
BROKEN_STREAM = (1).to_bytes(4, "big") + (0xFFFFFFFF).to_bytes(4, "big")


async def _nri_phase(
    t: FuzzTarget,
    total: int,
    workers: int,
    seed: int,
    every: int,
    out: dict[str, Any],
    samples: int = 10,
    heap_start: int = 1,
) -> None:
    seeds = nri_seeds(t.scenario)
    counts: Counter[str] = Counter()
    vitals: list[tuple[int, int, int, int]] = []
    hangs: list[tuple[int, str, bool, int]] = []
    next_i = 0
    step = max(total // 10, 1)
    sample = max(total // max(samples, 10), 1)

    async def worker(w: int) -> None:
        nonlocal next_i
        mut = Mutator(seed * 1000 + w)
        while next_i < total and t.alive():
            i = next_i
            next_i += 1
            if every and i % every == every - 1:
                # a broken byte stream: the plugin must drop the connection and come back
                counts[
                    "stream-broken" if await t.break_stream(BROKEN_STREAM) else "stream-already-closed"
                ] += 1
                continue
            method, payload = seeds[i % len(seeds)]
            links = len(t.runtime.links)
            outcome = await t.nri(method, mut.mutate(payload), timeout=5.0)
            counts[outcome] += 1
            if outcome == "hang" and len(hangs) < 100:
                # where a hang happens: the request index, its method, whether the plugin reconnected while
                # it was in flight, and how many requests after the last stream break
                since = i % every if every else i
                hangs.append((i, method, len(t.runtime.links) != links, since))
            if i % sample == 0:
                v = t.vitals()
                vitals.append((i, v.rss_kib, v.fds, v.anon_kib))
            if i % step == 0:
                if t.footprint_dir is not None:
                    out.setdefault("footprints", []).append(_summary("nri", i, await t.footprint()))
                if t.heap_profile is not None and i >= step * heap_start:
                    out.setdefault("heap_snapshots", []).append(str(await t.heap_snapshot()))

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    if t.footprint_dir is not None:
        out.setdefault("footprints", []).append(_summary("nri", next_i, await t.footprint()))
    if t.heap_profile is not None:
        out.setdefault("heap_snapshots", []).append(str(await t.heap_snapshot()))
    out["nri"] = {
        "requests": next_i,
        "seconds": round(time.monotonic() - started, 1),
        "outcomes": dict(counts),
        "hangs": counts["hang"],
        "hang_sites": hangs,
        "vitals": vitals,
    }


def _summary(phase: str, i: int, report: dict[str, Any], top: int = 12) -> dict[str, Any]:
    """The figures of one footprint report worth printing (the whole report is in the --footprint dir)."""
    pm = report["pymalloc"]
    return {
        "phase": phase,
        "i": i,
        "rss_kib": report["rss_kib"],
        "arenas": pm.get("arenas_allocated_current"),
        "allocated_kib": pm.get("bytes_in_allocated_blocks", 0) // 1024,
        "available_kib": pm.get("bytes_in_available_blocks", 0) // 1024,
        "unused_pools": pm.get("unused_pools"),
        "gc_objects": report["gc_objects"],
        "reachable": report["reachable_objects"],
        "top": [(c["name"], c["entries"], c["bytes"] // 1024) for c in report["containers"][:top]],
        "lru": [(c["name"], c["entries"]) for c in report["lru_caches"][:6]],
    }


async def _proxy_phase(t: FuzzTarget, total: int, workers: int, seed: int, out: dict[str, Any]) -> None:
    assert t.channel is not None
    channel = t.channel
    seeds = proxy_seeds(t.scenario)
    counts: Counter[str] = Counter()
    vitals: list[tuple[int, int, int, int]] = []
    next_i = 0
    step = max(total // 10, 1)

    async def worker(w: int) -> None:
        nonlocal next_i
        mut = Mutator(seed * 7919 + w)
        while next_i < total and t.alive():
            i = next_i
            next_i += 1
            method, payload = seeds[i % len(seeds)]
            counts[await proxy_call(channel, method, mut.mutate(payload), timeout=5.0)] += 1
            if i % step == 0:
                v = t.vitals()
                vitals.append((i, v.rss_kib, v.fds, v.anon_kib))

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    out["proxy"] = {
        "messages": next_i,
        "seconds": round(time.monotonic() - started, 1),
        "outcomes": dict(counts),
        "hangs": counts["hang"],
        "vitals": vitals,
    }


async def _valid_session(t: FuzzTarget) -> dict[str, Any]:
    assert t.channel is not None
    batch = next(p for p in t.scenario.pods if p.name == "batch-job")
    worker = next(c for c in t.scenario.containers if c.pod_sandbox_id == batch.id)
    # the mutated requests may have re-announced this sandbox id with other labels (a runtime's word is
    # taken): a valid session starts the pod again, as a runtime would, then creates its container
    await t.runtime.run_pod_sandbox(batch)
    resp = await t.runtime.create_container(batch, worker)
    res = resp.adjust.linux.resources if resp is not None else api.LinuxResources()
    nri_ok = res.cpu.shares.value == 1024 and res.memory.limit.value == 2 << 30
    proxy = [await proxy_call(t.channel, m, p, timeout=5.0) for m, p in proxy_seeds(t.scenario)]
    return {"nri_create_container_ok": nri_ok, "proxy_ok": proxy.count("ok"), "proxy_total": len(proxy)}


def agent_errors(log_text: str) -> dict[str, int]:
    """How often each error the agent logged (it runs at `--log-level error`, JSON lines) occurred, by its
    message and error text's type: hostile input must give none of its own (bugs surface here, e.g. a
    compiled-build type check that raises where the interpreter let the value through)."""
    counts: dict[str, int] = {}
    for line in log_text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            rec = {"event": line[:120]}  # not a log record: a traceback line, a crash message
        if not isinstance(rec, dict):
            continue
        error = str(rec.get("error", ""))
        key = f"{rec.get('event', '?')}" + (f" ({error.split(':', 1)[0]})" if error else "")
        counts[key] = counts.get(key, 0) + 1
    return counts


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine()}
    async with FuzzTarget(
        request_timeout=10.0,
        heap_profile=args.heap_profile,
        footprint=args.footprint,
        agent_env=dict(kv.split("=", 1) for kv in args.agent_env),
    ) as t:
        v = t.vitals()
        out["start"] = {"rss_kib": v.rss_kib, "fds": v.fds, "anon_kib": v.anon_kib}
        if args.nri:
            await _nri_phase(
                t,
                args.nri,
                args.concurrency,
                args.seed,
                args.stream_break_every,
                out,
                args.samples,
                args.heap_start,
            )
        if args.proxy and t.alive():
            await _proxy_phase(t, args.proxy, args.concurrency, args.seed, out)
        out["crashed"] = not t.alive()
        out["agent_errors"] = agent_errors(t.agent_log())
        if t.alive():
            out["valid_session"] = await _valid_session(t)
            if t.heap_profile is not None:
                out.setdefault("heap_snapshots", []).append(str(await t.heap_snapshot()))
            if t.footprint_dir is not None:
                out.setdefault("footprints", []).append(_summary("end", 0, await t.footprint()))
            v = t.vitals()
            out["end"] = {"rss_kib": v.rss_kib, "fds": v.fds, "anon_kib": v.anon_kib}
        else:
            out["agent_log_tail"] = t.agent_log()[-4000:]
    out["load_average"] = os.getloadavg()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nri", type=int, default=10_000, help="mutated NRI requests")
    p.add_argument("--proxy", type=int, default=1_000, help="mutated proxy messages")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--quick", action="store_true", help="a smoke run (`nox -s bench -- --quick`): 1,000 NRI, 100 proxy"
    )
    p.add_argument("--stream-break-every", type=int, default=10_000, help="0: never break the byte stream")
    p.add_argument("--json", action="store_true", help="print the result as JSON only")
    p.add_argument(
        "--samples", type=int, default=10, help="RSS/fd samples in the NRI phase (at least 10: every 10 %%)"
    )
    p.add_argument(
        "--heap-profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run the agent under tests.support.heaptrace: tracemalloc from the warm-up (10 %% of the NRI"
        " phase) on, snapshots then, at every further 10 %%, after the NRI phase and at the end in DIR"
        " (compare: python -m tests.support.heaptrace --diff A B). Slow.",
    )
    p.add_argument(
        "--heap-start",
        type=int,
        default=1,
        metavar="TENTHS",
        help="with --heap-profile: start tracing after this many tenths of the NRI phase (default 1: 10 %%),"
        " then a snapshot at every further tenth",
    )
    p.add_argument(
        "--footprint",
        type=Path,
        default=None,
        metavar="DIR",
        help="run the agent under tests.support.heaptrace (no tracing) and take a footprint report (RSS,"
        " pymalloc arenas, the largest containers by bytes held) at every 10 %% of the NRI phase and at the"
        " end into DIR; a summary is in the result. Each report pauses the agent for a moment.",
    )
    p.add_argument(
        "--agent-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the agent's environment (repeatable; e.g. KOORDQOS_GC_POLICY=build)",
    )
    args = p.parse_args()
    if any("=" not in kv for kv in args.agent_env):
        p.error("--agent-env takes KEY=VALUE")
    if args.quick:
        args.nri, args.proxy = min(args.nri, 1_000), min(args.proxy, 100)
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
