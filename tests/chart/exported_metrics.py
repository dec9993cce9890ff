"""The metric names the agent exports, and the names a PromQL expression refers to."""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache

import koordqos
from koordqos.observability import REGISTRY

# Series names Prometheus itself produces for every scrape target (not exported by the agent).
PROMETHEUS_SERIES = frozenset({"up"})
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}
_METRIC_TOKEN = re.compile(r"\bkoordqos_[a-zA-Z0-9_]+")


@cache
def exported_series() -> frozenset[str]:
    """Every series name on the agent's /metrics: all koordqos modules imported, then the registry read."""
    for mod in pkgutil.walk_packages(koordqos.__path__, "koordqos."):
        if mod.name.startswith("koordqos.demo") or mod.name.endswith("__main__"):
            continue  # the demo is an optional extra and defines no agent metric; __main__ runs the CLI
        importlib.import_module(mod.name)
    names: set[str] = set()
    for family in REGISTRY.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return frozenset(names)


def referenced_metrics(expr: str) -> set[str]:
    """The koordqos_* series names in a PromQL expression."""
    return set(_METRIC_TOKEN.findall(expr))


def unknown_metrics(expr: str) -> set[str]:
    """Names in `expr` the agent does not export (empty when every name is real)."""
    return referenced_metrics(expr) - exported_series()
