"""What the user sees while the demo runs: a live terminal view (rich), or plain lines (`--no-live`)."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from koordqos.demo.runner import Phase
from koordqos.demo.sampler import DecisionRow, Point

DECISIONS_SHOWN = 8


def _quota(q: int) -> str:
    return "unlimited" if q < 0 else f"{q} µs ({q / 100_000:.2f} cores)"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f} ms"


class PlainView:
    """One line per second and one per decision (no TTY needed)."""

    def __init__(self) -> None:
        self._last = 0.0
        self._phase = ""

    def phase(self, phase: Phase, index: int, total: int, seconds: float) -> None:
        """A phase begins."""
        self._phase = phase.name
        print(f"== phase {index + 1}/{total}: {phase.title} ({seconds:g} s)", flush=True)

    def point(self, point: Point, progress: float, ls_used: float | None) -> None:
        """A new reading (printed at most once a second)."""
        if time.monotonic() - self._last < 1.0 and progress < 1.0:
            return
        self._last = time.monotonic()
        used = "" if ls_used is None else f" agent-seen non-BE {ls_used:.2f} cores"
        print(
            f"t={point.t:6.1f}s {point.phase:<14} LS p50 {_ms(point.ls_p50_ms)} p99 {_ms(point.ls_p99_ms)} "
            f"LS {point.ls_cpu:.2f} BE {point.be_cpu:.2f} cores quota {_quota(point.quota)}{used}",
            flush=True,
        )

    def decision(self, row: DecisionRow) -> None:
        """A decision of the agent."""
        print(f"   decision t={row.t:.1f}s {row.action} {row.target}: {row.old} → {row.new}", flush=True)

    def note(self, text: str) -> None:
        """A message."""
        print(text, flush=True)

    def close(self) -> None:
        """Nothing to tear down."""


class LiveView:
    """The rich live view: phase progress, current figures, the newest decisions."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = console if console is not None else Console()
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.live.start()
        self._phase: tuple[Phase, int, int, float] | None = None
        self._point: Point | None = None
        self._progress = 0.0
        self._ls_used: float | None = None
        self._decisions: deque[DecisionRow] = deque(maxlen=DECISIONS_SHOWN)
        self._notes: deque[str] = deque(maxlen=3)
        self._count = 0

    def _render(self) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        parts: list[Any] = []
        if self._phase is not None:
            phase, index, total, seconds = self._phase
            head = Table.grid(padding=(0, 2))
            head.add_row(
                f"[bold]phase {index + 1}/{total}[/]: {phase.title}",
                ProgressBar(total=1.0, completed=self._progress, width=40),
                f"{self._progress * seconds:4.0f}/{seconds:g} s",
            )
            parts.append(head)
        figures = Table(show_header=True, header_style="bold", expand=False)
        for col in ("t", "LS p50", "LS p99", "LS CPU", "BE CPU", "BE quota (agent's choice)", "non-BE seen"):
            figures.add_column(col)
        p = self._point
        if p is not None:
            used = "—" if self._ls_used is None else f"{self._ls_used:.2f} cores"
            figures.add_row(
                f"{p.t:.1f} s",
                _ms(p.ls_p50_ms),
                _ms(p.ls_p99_ms),
                f"{p.ls_cpu:.2f} cores",
                f"{p.be_cpu:.2f} cores",
                _quota(p.quota),
                used,
            )
        parts.append(figures)
        dec = Table(show_header=True, header_style="bold", expand=True)
        for col in ("t", "action", "target", "old → new"):
            dec.add_column(col)
        for d in self._decisions:
            short = "/".join(d.target.split("/")[-2:])  # besteffort/cpu.cfs_quota_us
            dec.add_row(f"{d.t:.1f} s", d.action, short, f"{d.old} → {d.new}")
        parts.append(Panel(dec, title=f"CPU suppress decisions ({self._count})"))
        for n in self._notes:
            parts.append(f"[dim]{n}[/]")
        return Group(*parts)

    def phase(self, phase: Phase, index: int, total: int, seconds: float) -> None:
        """A phase begins."""
        self._phase = (phase, index, total, seconds)
        self._progress = 0.0
        self.live.update(self._render())

    def point(self, point: Point, progress: float, ls_used: float | None) -> None:
        """A new reading."""
        self._point, self._progress, self._ls_used = point, progress, ls_used
        self.live.update(self._render())

    def decision(self, row: DecisionRow) -> None:
        """A decision of the agent."""
        self._decisions.append(row)
        self._count += 1
        self.live.update(self._render())

    def note(self, text: str) -> None:
        """A message."""
        self._notes.append(text)
        self.live.update(self._render())

    def close(self) -> None:
        """Stop refreshing (the last frame stays on screen)."""
        self.live.stop()


def make_view(live: bool) -> PlainView | LiveView:
    """The live view on a terminal when asked for, plain lines otherwise."""
    if live and sys.stdout.isatty():
        return LiveView()
    return PlainView()
