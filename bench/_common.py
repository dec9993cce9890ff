"""Shared helpers for the benchmarks: percentiles, medians of runs, a small table printer."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100) by nearest rank."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: Sequence[float]) -> float:
    """Median of several runs."""
    return statistics.median(values)


def machine() -> str:
    """One line naming the machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    return f"{os.cpu_count()} CPUs, {cpu}, Python {platform.python_version()}"


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the common `--quick` and `--runs` options."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    p.add_argument("--runs", type=int, default=5, help="runs to take the median of")
    return p


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Render rows as a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
