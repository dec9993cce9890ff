"""Benchmark: HostActuator batches (oom_score_adj writes on a synthetic /proc), in a worker thread vs inline.

Cases, each a batch of `OomScoreAdjWrite` over N processes of a synthetic /proc on tmpfs:
* unchanged — the value is already there (two confined opens, read, compare)
* written   — the value alternates (read, compare, confined write, decision recorded)
`thread` is `await HostActuator.apply` (one worker-thread hop per batch, what the agent does); `inline` is
`apply_now` on the loop, to show what the hop costs and what it keeps off the loop.

    python bench/host.py [--quick] [--runs N]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from _common import machine, median, parser, quiet_logs, table
from koordqos.decisions import DecisionLog
from koordqos.host import HostActuator, OomScoreAdjWrite

SIZES = (1, 10, 200)


async def run(base: Path, rounds: int) -> dict[tuple[str, int, str], float]:
    """Median µs per batch by (case, size, mode) over `rounds` batches."""
    for pid in range(1, max(SIZES) + 1):
        (base / str(pid)).mkdir()
        (base / str(pid) / "oom_score_adj").write_text("0\n")
    host = HostActuator(DecisionLog(size=256), proc_root=base)
    out: dict[tuple[str, int, str], float] = {}
    for case in ("unchanged", "written"):
        for n in SIZES:
            for mode in ("inline", "thread"):
                samples = []
                for i in range(rounds):
                    value = (i % 2) if case == "written" else 0
                    intents = [OomScoreAdjWrite(p, value) for p in range(1, n + 1)]
                    t = time.perf_counter()
                    if mode == "thread":
                        await host.apply("bench", intents)
                    else:
                        host.apply_now("bench", intents)
                    samples.append(time.perf_counter() - t)
                out[(case, n, mode)] = median(samples) * 1e6
    return out


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    quiet_logs()
    rounds = 20 if args.quick else 200
    runs: list[dict[tuple[str, int, str], float]] = []
    for _ in range(1 if args.quick else args.runs):
        with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
            runs.append(asyncio.run(run(Path(d), rounds)))
    print(f"HostActuator batches, {machine()}; median of {len(runs)} runs x {rounds} batches")
    rows = []
    for case in ("unchanged", "written"):
        for n in SIZES:
            inline = median([r[(case, n, "inline")] for r in runs])
            thread = median([r[(case, n, "thread")] for r in runs])
            rows.append((case, n, f"{inline:.1f}", f"{thread:.1f}", f"{inline / n:.1f}"))
    print(table(rows, ("case", "intents", "inline µs/batch", "thread µs/batch", "inline µs/intent")))


if __name__ == "__main__":
    main()
