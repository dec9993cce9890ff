"""NodeSLO lint (issue #15 item 8): unknown keys with the closest valid name, koordinator's value ranges."""

from __future__ import annotations

from typing import Any

import pytest

from koordqos.model.nodeslo import parse_nodeslo
from koordqos.model.nodeslo_lint import nodeslo_findings, nodeslo_unknown_keys


def test_the_issues_nodeslo_typos_are_found_in_objects_and_bare_specs() -> None:
    spec = {"resourceUsedThresholdWithBE": {"enabel": True, "cpuSupressThresholdPercent": 65}}
    for doc, prefix in ((spec, ""), ({"kind": "NodeSLO", "spec": spec}, "spec.")):
        described = [u.describe() for u in nodeslo_unknown_keys(doc)]
        assert described == [
            f'{prefix}resourceUsedThresholdWithBE.enabel: unknown field (did you mean "enable"?)',
            f"{prefix}resourceUsedThresholdWithBE.cpuSupressThresholdPercent: unknown field "
            '(did you mean "cpuSuppressThresholdPercent"?)',
        ]


def test_object_envelope_metadata_and_free_form_extensions_are_not_reported() -> None:
    doc = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": "n", "whatever": 1},
        "spec": {
            "extensions": {"vendor": {"x": 1}},
            "hostApplications": [{"name": "a", "strategy": {"free": 1}, "cgroupPath": {"bse": "x"}}],
            "name": "not a spec key",
        },
        "staus": {},
    }
    found = {u.path: u.suggestion for u in nodeslo_unknown_keys(doc)}
    assert found == {"staus": "status", "spec.hostApplications[0].cgroupPath.bse": "base", "spec.name": None}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 165}},
            "cpuSuppressThresholdPercent",
        ),
        ({"resourceUsedThresholdWithBE": {"cpuSuppressMinPercent": -1}}, "cpuSuppressMinPercent"),
        (
            {"resourceUsedThresholdWithBE": {"memoryEvictThresholdPercent": 101}},
            "memoryEvictThresholdPercent",
        ),
        ({"resourceUsedThresholdWithBE": {"cpuEvictTimeWindowSeconds": -5}}, "cpuEvictTimeWindowSeconds"),
        ({"cpuBurstStrategy": {"sharePoolThresholdPercent": 150}}, "sharePoolThresholdPercent"),
        ({"cpuBurstStrategy": {"cpuBurstPercent": -1}}, "cpuBurstPercent"),
        ({"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"groupIdentity": 3}}}}, "groupIdentity"),
        ({"resourceQOSStrategy": {"beClass": {"cpuQOS": {"schedIdle": 2}}}}, "schedIdle"),
    ],
)
def test_out_of_range_values_are_findings_but_parse_as_koordlet_does(
    spec: dict[str, Any], field: str
) -> None:
    # issue #15 item 8: cpuSuppressThresholdPercent 165 was a "valid NodeSLO" for `config validate`
    found = nodeslo_findings({"spec": spec})
    assert len(found) == 1
    assert found[0].path.endswith(field)
    assert found[0].problem.startswith("out of range")
    parse_nodeslo({"spec": spec})  # the agent still reads it; the strategies check it at run time


@pytest.mark.parametrize("value", [0, 100])
def test_percent_bounds_are_inclusive(value: int) -> None:
    assert nodeslo_findings({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": value}}) == []
