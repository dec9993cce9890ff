"""NodeSLO checks beyond validation: keys the agent does not know (typos, or fields newer than this agent)
and values outside koordinator's ranges.

`parse_nodeslo` ignores unknown keys and leaves range checks to the strategies at run time, as koordlet does;
`config validate` reports both as errors, the agent unknown keys as a logged, counted warning
(`koordqos.kube.sources`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from koordqos.model.lint import UNKNOWN, Finding, closest, lint
from koordqos.model.nodeslo import NodeSLO

_OBJECT_KEYS = ("apiVersion", "kind", "metadata", "spec", "status")
_METADATA_FIELDS = frozenset({"name", "resource_version", "generation"})  # on the model, not spec keys


def nodeslo_findings(doc: Any) -> list[Finding]:
    """Findings in a NodeSLO object (`kind`/`spec`) or a bare spec, as `parse_nodeslo` reads them."""
    if not isinstance(doc, Mapping):
        return []
    if "kind" not in doc and "spec" not in doc:
        return lint(NodeSLO, doc, "", _METADATA_FIELDS)
    out = [Finding(str(k), UNKNOWN, closest(str(k), _OBJECT_KEYS)) for k in doc if k not in _OBJECT_KEYS]
    out.extend(lint(NodeSLO, doc.get("spec"), "spec", _METADATA_FIELDS))
    return out


def nodeslo_unknown_keys(doc: Any) -> list[Finding]:
    """Only the unknown keys (what the agent warns about)."""
    return [f for f in nodeslo_findings(doc) if f.unknown]
