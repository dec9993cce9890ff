"""resource_value memoises short resource names and quantities only: long hostile ones are parsed again."""

from __future__ import annotations

import tracemalloc

import pytest

from koordqos.errors import ModelError
from koordqos.model.quantity import parse_resource_list, resource_value


def test_long_hostile_resource_names_are_not_memoised() -> None:
    # an extended-resource-spec may name any resource: 5,000 distinct 4 KiB names, each valid otherwise
    tracemalloc.start()
    try:
        parse_resource_list({"warm-up/" + "w" * 4096: "1"})
        before, _ = tracemalloc.get_traced_memory()
        for i in range(5_000):
            values, errors = parse_resource_list({f"example.com/{i:05d}" + "r" * 4096: "2"})
            assert not errors
            assert list(values.values()) == [2]
        del values
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 64 * 1024  # an lru_cache of 4,096 of them held 16 MiB


def test_short_names_are_still_memoised_and_malformed_quantities_raise() -> None:
    resource_value("cpu", "1500m")
    from koordqos.model.quantity import _resource_value

    hits = _resource_value.cache_info().hits
    assert resource_value("cpu", "1500m") == 1500
    assert _resource_value.cache_info().hits == hits + 1
    with pytest.raises(ModelError):
        resource_value("memory", "lots")
