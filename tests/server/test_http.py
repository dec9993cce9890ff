"""/debug/state's `last_metrics` is JSON, not a Python repr string (issue #15 item 10)."""

from __future__ import annotations

import json
from types import MappingProxyType

from koordqos.metrics.types import BESample, MetricSnapshot, NodeSample, PodSample
from koordqos.server.http import _jsonable


def test_a_metric_snapshot_becomes_nested_json_objects() -> None:
    snap = MetricSnapshot(
        at=12.5,
        interval=1.0,
        node=NodeSample(cpu_usage_cores=1.25, memory_total=1 << 30, cpu_count=4),
        pods=MappingProxyType({"u1": PodSample(uid="u1", cpu_usage_cores=0.5)}),
        be=BESample(),
    )
    out = _jsonable(snap)
    assert isinstance(out, dict)
    assert out["node"]["cpu_usage_cores"] == 1.25
    assert out["node"]["cpu_count"] == 4
    assert out["pods"]["u1"]["cpu_usage_cores"] == 0.5
    text = json.dumps(out)
    assert "NodeSample(" not in text
    assert "mappingproxy" not in text
