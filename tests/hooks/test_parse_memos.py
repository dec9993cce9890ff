"""The memos of parsed annotation texts (extended-resource-spec, resource-status) are bounded by bytes."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from koordqos.hooks.cpusetutil import STATUS_MEMO_BYTES, parse_resource_status
from koordqos.hooks.resources import EXTENDED_MEMO_BYTES, extended_from_annotation
from koordqos.model.keys import ANNOTATION_EXTENDED_RESOURCE_SPEC, ANNOTATION_RESOURCE_STATUS


def _spec(i: int) -> dict[str, str]:
    # a valid spec of ~2 KiB, distinct per i: 20 containers with their batch requests
    containers = {}
    for n in range(20):
        containers[f"c{i}-{n:02d}-{'x' * 40}"] = {"requests": {"kubernetes.io/batch-cpu": f"{1000 + n}"}}
    return {ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps({"containers": containers})}


def _status(i: int) -> dict[str, str]:
    numa = [{"node": n, "resources": {"cpu": f"{n + 1}", "memory": f"{i + 1}Mi"}} for n in range(24)]
    return {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0-3", "numaNodeResources": numa})}


@pytest.mark.parametrize(
    ("parse", "annotations", "budget"),
    [
        (extended_from_annotation, _spec, EXTENDED_MEMO_BYTES),
        (parse_resource_status, _status, STATUS_MEMO_BYTES),
    ],
    ids=["extended-resource-spec", "resource-status"],
)
def test_many_distinct_texts_keep_the_memo_within_its_budget(
    parse: Callable[[dict[str, str]], Any], annotations: Callable[[int], dict[str, str]], budget: int
) -> None:
    # 3,000 distinct ~2 KiB texts, one per call as pods come and go: an lru_cache of 1,024 held 1,024 texts
    # and what was parsed from them (several MiB); the memo holds its budget of bytes
    first = annotations(-1)
    assert parse(first) is parse(first)  # the same text: parsed once
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(3_000):
            assert parse(annotations(i)) is not None
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 3 * budget  # texts weighed at 4 bytes a character: what they parse to fits in


def test_a_malformed_text_is_not_memoised_and_raises_every_time() -> None:
    from koordqos.hooks.resources import ExtendedResourceSpecError, _parse_extended

    bad = {ANNOTATION_EXTENDED_RESOURCE_SPEC: "{not json"}
    for _ in range(2):
        with pytest.raises(ExtendedResourceSpecError):
            extended_from_annotation(bad)
    assert "{not json" not in _parse_extended.memo
