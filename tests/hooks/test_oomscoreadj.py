"""OOMScoreAdj: koordlet's cases O1–O9 (docs/behaviour-runtime-hooks.md, "OOMScoreAdj"); O10 is in
test_reconciler.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordqos.decisions import DecisionLog
from koordqos.hooks.context import ContainerContext, ContainerRequest
from koordqos.hooks.oomscoreadj import OOMScoreAdj, target_oom_score_adj
from koordqos.host import HostActuator, OomScoreAdjWrite, Outcome

POD = "koordinator.sh/oom-score-adj"
SPEC = "koordinator.sh/oom-score-adj-spec"


def set_oom_score_adj(
    proc_root: Path, pids: list[int], value: int, decisions: DecisionLog | None = None
) -> tuple[int, int]:
    """(written, skipped) of applying `value` to `pids` through the host actuator."""
    host = HostActuator(DecisionLog() if decisions is None else decisions, proc_root=proc_root)
    results = host.apply_now("test", [OomScoreAdjWrite(pid, value) for pid in pids])
    written = sum(r.outcome is Outcome.WRITTEN for r in results)
    skipped = sum(r.outcome in (Outcome.VANISHED, Outcome.FAILED) for r in results)
    return written, skipped


def proc(tmp_path: Path, values: dict[int, int | None]) -> Path:
    for pid, v in values.items():
        d = tmp_path / str(pid)
        d.mkdir(parents=True)
        if v is not None:
            (d / "oom_score_adj").write_text(f"{v}\n")
    return tmp_path


def read(root: Path, pid: int) -> int:
    return int((root / str(pid) / "oom_score_adj").read_text())


def ctx(annotations: dict[str, str] | None, sandbox: bool = False) -> ContainerContext:
    return ContainerContext(
        ContainerRequest(
            pod_uid="xxxxxx",
            container_name="c1",
            container_id="containerd://yyyyyy",
            sandbox=sandbox,
            pod_annotations=annotations or {},
            cgroup_parent="kubepods.slice/kubepods-podxxxxxx.slice/cri-containerd-yyyyyy.scope",
        )
    )


@pytest.mark.parametrize(
    ("annotations", "initial", "want"),
    [
        (None, {12: 0, 13: 0}, {12: 0, 13: 0}),  # O1
        ({POD: "-500"}, {12: 0, 13: -500}, {12: -500, 13: -500}),  # O2
        ({POD: "-500", SPEC: '{"c1": 200}'}, {12: 0, 13: 0}, {12: 200, 13: 200}),  # O3
        ({POD: "-2000"}, {12: 0, 13: 0}, {12: 0, 13: 0}),  # O4
        ({SPEC: "{invalid}"}, {12: 0, 13: 0}, {12: 0, 13: 0}),  # O5
    ],
    ids=["O1", "O2", "O3", "O4", "O5"],
)
def test_container_oom_score_adj(
    tmp_path: Path, annotations: dict[str, str] | None, initial: dict[int, int], want: dict[int, int]
) -> None:
    root = proc(tmp_path, dict(initial))
    target = OOMScoreAdj().target(ctx(annotations))
    if target is not None:
        set_oom_score_adj(root, list(initial), target)
    assert {pid: read(root, pid) for pid in initial} == want


def test_o2_only_differing_pid_is_written(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: 0, 13: -500})
    assert set_oom_score_adj(root, [12, 13], -500) == (1, 0)


def test_o6_sandbox_untouched() -> None:
    assert OOMScoreAdj().target(ctx({POD: "-500"}, sandbox=True)) is None


def test_o7_adjustment_value_and_sandbox() -> None:
    c = ctx({POD: "-500"})
    OOMScoreAdj().set_container_oom_score_adj(c)
    assert c.response.oom_score_adj == -500
    with pytest.raises(ValueError, match="nil"):
        OOMScoreAdj().set_container_oom_score_adj(None)


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        (None, None),
        ({"foo": "bar"}, None),
        ({POD: "-500"}, -500),
        ({SPEC: '{"c1":100}', POD: "-500"}, 100),
        ({SPEC: '{"c2":100}', POD: "-500"}, -500),
        ({SPEC: '{"c2":100}'}, None),
    ],
)
def test_o8_lookup(annotations: dict[str, str] | None, want: int | None) -> None:
    assert target_oom_score_adj(annotations, "c1") == want


@pytest.mark.parametrize("annotations", [{SPEC: "{invalid}"}, {POD: "not-a-number"}])
def test_o8_lookup_errors(annotations: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="oom-score-adj"):
        target_oom_score_adj(annotations, "c1")


def test_o9_set_for_pids(tmp_path: Path) -> None:
    assert set_oom_score_adj(tmp_path, [], -500) == (0, 0)
    a = proc(tmp_path / "a", {12: 0, 13: 100})
    assert set_oom_score_adj(a, [12, 13], -500) == (2, 0)
    b = proc(tmp_path / "b", {12: 0, 13: -500})
    assert set_oom_score_adj(b, [12, 13], -500) == (1, 0)
    c = proc(tmp_path / "c", {12: None, 13: 0})
    assert set_oom_score_adj(c, [12, 13], -500) == (1, 1)
    assert read(c, 13) == -500


def test_dry_run_records_and_changes_nothing(tmp_path: Path) -> None:
    root = proc(tmp_path, {12: 0})
    log = DecisionLog(dry_run=True)
    assert set_oom_score_adj(root, [12], -500, log) == (0, 0)
    assert read(root, 12) == 0
    assert log.recent()[-1].new == -500
    assert log.recent()[-1].dry_run


def _ctx_for(uid: str, annotations: dict[str, str]) -> ContainerContext:
    return ContainerContext(
        ContainerRequest(
            pod_uid=uid,
            container_name="c1",
            container_id="containerd://yyyyyy",
            pod_annotations=annotations,
        )
    )


@pytest.mark.parametrize(
    ("annotations", "reason", "message"),
    [
        ({SPEC: "{invalid}"}, "malformed", "malformed oom-score-adj"),
        ({POD: "-2000"}, "out_of_range", "out of range"),
    ],
    ids=["malformed", "out-of-range"],
)
def test_bad_annotation_logged_once_per_pod_and_value_counted_every_time(
    annotations: dict[str, str], reason: str, message: str
) -> None:
    from structlog.testing import capture_logs

    from koordqos.hooks.oomscoreadj import BAD_ANNOTATIONS

    hook = OOMScoreAdj()
    counter = BAD_ANNOTATIONS.labels(reason)
    before = counter._value.get()
    with capture_logs() as logs:
        for _ in range(5):  # five reconcile passes
            assert hook.target(_ctx_for("pod-a", annotations)) is None
        assert hook.target(_ctx_for("pod-b", annotations)) is None  # another pod: logged
        changed = {k: v + " " for k, v in annotations.items()}  # same pod, new value: logged
        assert hook.target(_ctx_for("pod-a", changed)) is None
    warned = [e for e in logs if message in e["event"]]
    assert [e["pod_uid"] for e in warned] == ["pod-a", "pod-b", "pod-a"]
    assert counter._value.get() == before + 7
