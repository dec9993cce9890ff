"""kube/sources: NodeSLO unknown keys are a logged, counted warning in the agent (issue #15 item 8)."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from koordqos import observability as obs
from koordqos.bus import EventBus
from koordqos.events.types import NodeSLOUpdated
from koordqos.kube.sources import NodeSLOSource


def _count(source: str) -> float:
    value = obs.REGISTRY.get_sample_value("koordqos_nodeslo_unknown_fields_total", {"source": source})
    return value or 0.0


async def test_unknown_nodeslo_keys_are_applied_around_warned_and_counted_once() -> None:
    bus = EventBus()
    seen: list[NodeSLOUpdated] = []
    bus.subscribe("t", lambda e, s: seen.append(e), NodeSLOUpdated)
    runner = asyncio.create_task(bus.run())
    source = NodeSLOSource(bus, "n1", recorder=None, source="unknown-keys-test")
    doc = {
        "kind": "NodeSLO",
        "metadata": {"name": "n1", "resourceVersion": "1"},
        "spec": {"resourceUsedThresholdWithBE": {"enable": True, "cpuSupressThresholdPercent": 50}},
    }
    before = _count("unknown-keys-test")
    with capture_logs() as logs:
        await source.apply(doc)
        await source.apply({**doc, "metadata": {"name": "n1", "resourceVersion": "2"}})  # resync: once only
    await bus.drained()
    runner.cancel()
    warnings = [e for e in logs if e["event"] == "unknown NodeSLO field ignored"]
    assert len(warnings) == 1
    assert warnings[0]["field"] == "spec.resourceUsedThresholdWithBE.cpuSupressThresholdPercent"
    assert warnings[0]["suggestion"] == "cpuSuppressThresholdPercent"
    assert warnings[0]["log_level"] == "warning"
    assert _count("unknown-keys-test") == before + 1
    # the object is still used (a newer CRD field must not make the agent reject it)
    assert source.invalid_count == 0
    threshold = seen[-1].slo.resource_used_threshold_with_be
    assert threshold is not None
    assert threshold.enable is True
