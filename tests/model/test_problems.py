"""Malformed-value reports: once per object and value, in bounded memory, with a bounded metric label set."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from koordqos import observability as obs
from koordqos.model import problems
from koordqos.model.pod import parse_pod
from koordqos.model.problems import field_label, forget_problems, report_problem


class _Log:
    """Counts warnings instead of rendering them (the memory measured is the memo's, not the log's)."""

    def __init__(self) -> None:
        self.warnings: list[dict[str, Any]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.warnings.append({"event": event, "uid": kw["uid"], "field": kw["field"]})


def test_each_object_and_value_is_reported_once() -> None:
    forget_problems()
    assert report_problem("pod", "u1", "ns/p", "koordinator.sh/qosClass", "gold", "unknown")
    assert not report_problem("pod", "u1", "ns/p", "koordinator.sh/qosClass", "gold", "unknown")
    assert report_problem("pod", "u1", "ns/p", "koordinator.sh/qosClass", "silver", "unknown")
    assert report_problem("pod", "u2", "ns/q", "koordinator.sh/qosClass", "gold", "unknown")


def test_many_long_hostile_values_keep_the_memo_at_its_fixed_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # 20,000 distinct malformed values of 4 KiB on distinct pods (a hostile runtime or API client): every one
    # is reported, and the memory of what was reported stays the table made at import (the LRU of the
    # value tuples it replaces held 8,192 of them: ~2 MiB of 256-byte prefixes, plus the uids)
    log = _Log()
    monkeypatch.setattr(problems, "log", log)

    def report(i: int) -> None:
        value = f"{i:06d}" + "v" * 4090
        report_problem("pod", f"uid-{i:06d}-" + "u" * 100, "ns/p", "koordinator.sh/cpuQOS", value, "bad")

    tracemalloc.start()
    try:
        forget_problems()  # a clear makes the table anew: made while tracing, so it is in `before`
        for i in range(10_000):  # warm-up: the interpreter's free lists fill on this path
            report(i)
        log.warnings.clear()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(10_000, 30_000):
            report(i)
        reported = len(log.warnings)
        log.warnings.clear()  # the stub's list, not the memo
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reported == 20_000
    assert after - before < 16 * 1024
    assert problems._SEEN.nbytes <= 256 * 1024


def test_the_metric_label_leaves_out_the_container_name() -> None:
    assert field_label("containers[web].resources") == "containers[].resources"
    assert field_label("initContainers[a]b[c].resources") == "initContainers[].resources"
    assert field_label("koordinator.sh/qosClass") == "koordinator.sh/qosClass"


def _label_sets(kind: str) -> set[tuple[tuple[str, str], ...]]:
    return {
        tuple(sorted(s.labels.items()))
        for metric in obs.REGISTRY.collect()
        if metric.name == "koordqos_model_errors"
        for s in metric.samples
        if s.name.endswith("_total") and s.labels.get("kind") == kind
    }


def test_hostile_container_names_do_not_grow_the_metric_label_set() -> None:
    forget_problems()

    def pod(i: int) -> dict[str, Any]:
        name = f"c{i}-" + "x" * 200
        return {
            "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u-{i}"},
            "spec": {"containers": [{"name": name, "resources": {"requests": {"cpu": "lots"}}}]},
            "status": {"qosClass": "Burstable"},
        }

    parse_pod(pod(-1))
    sets = _label_sets("pod")
    before = obs.REGISTRY.get_sample_value(
        "koordqos_model_errors_total", {"kind": "pod", "field": "spec.containers[].resources"}
    )
    for i in range(200):
        parsed = parse_pod(pod(i))
        # the pod still says which container
        assert f"spec.containers[c{i}-{'x' * 200}].resources" in parsed.parse_problems
    assert _label_sets("pod") == sets
    after = obs.REGISTRY.get_sample_value(
        "koordqos_model_errors_total", {"kind": "pod", "field": "spec.containers[].resources"}
    )
    assert after == (before or 0.0) + 200
