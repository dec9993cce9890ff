"""`--dry-run` records the decisions a real run records (issue #32 item 5g), round after round: CPU suppress
planned from the would-be besteffort quota (cgroups/dryrun.py) takes the same 10 % recovery steps, a steady
decision is recorded once (it was recorded every round: the file never changed), and the files stay as
they were."""

from __future__ import annotations

from pathlib import Path

from tests.strategies.test_cpusuppress_first_round import BE_DIR, Node, _pod, build

# LS usage per round: 2.0 cores (cap 0.6), then 0.2 (target 2.4: four steps of 0.4 from 0.6), then steady
LS_USAGE = [2.0, 2.0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]


async def _run(tmp_path: Path, dry_run: bool) -> Node:
    node = build(tmp_path, dry_run=dry_run)
    node.add(_pod("ls", be=False))
    node.add(_pod("be", be=True))
    for ls in LS_USAGE:
        await node.round(ls + 0.5, {"uid-ls": ls, "uid-be": 0.5})
    return node


def _decisions(node: Node) -> list[tuple[object, ...]]:
    return [(d.strategy, d.target, d.action, d.old, d.new, d.reason) for d in node.env.decisions.recent()]


async def test_cpu_suppress_dry_run_decides_as_a_real_run(tmp_path: Path) -> None:
    real = await _run(tmp_path / "real", dry_run=False)
    dry = await _run(tmp_path / "dry", dry_run=True)
    quota = [(d[3], d[4]) for d in _decisions(real) if d[1] == f"{BE_DIR}/cpu.cfs_quota_us"]
    assert quota == [
        ("-1", "60000"),
        ("60000", "100000"),
        ("100000", "140000"),
        ("140000", "180000"),
        ("180000", "220000"),
        ("220000", "240000"),
    ]
    assert _decisions(dry) == _decisions(real)
    assert all(d.dry_run for d in dry.env.decisions.recent())
    assert dry.quota() == -1  # nothing written
    assert real.quota() == 240_000


async def test_psi_tightening_is_planned_in_a_dry_run_as_in_a_real_run(tmp_path: Path) -> None:
    """The PSI rule tightens CPU suppress: a dry-run's CPU suppress plans the tightened cap too (it was
    left untightened, so the dry-run showed BE capped less than a real run would)."""
    from tests.strategies import test_psirule as psi

    nodes = []
    for name, dry in (("real", False), ("dry", True)):
        n = psi.build(tmp_path / name)
        n.env.decisions.dry_run = dry
        await n.round(0.0)
        for _ in range(5):
            await n.round(0.3)
        nodes.append(n)
    real, dry = nodes

    def suppress(n: psi.Node) -> list[tuple[object, ...]]:
        keep = ("BECPUSuppress", psi.NAME)
        return [
            (d.strategy, d.target, d.action, d.old, d.new)
            for d in n.env.decisions.recent()
            if d.strategy in keep and d.action in ("write", "tighten")
        ]

    assert real.env.tightening.milli > 0
    assert dry.env.tightening.milli == real.env.tightening.milli
    assert suppress(dry) == suppress(real)
    assert [d for d in suppress(real) if d[2] == "tighten"]
    assert dry.marker.calls == []  # nothing done on the API server
    assert dry.evictor.evicted == []
