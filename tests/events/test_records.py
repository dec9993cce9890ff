"""The runtime's records (events/records.py) behave as the dataclasses they were: construction with the same
arguments and defaults, frozen, replace(), fields(), equality and hashing over every field. Run against the
compiled build too (`nox -s compiled`), where their `__init__`, `__eq__` and `__hash__` are native."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from koordqos.events import records
from koordqos.events.types import RuntimeContainer, RuntimeSandbox

FIELDS: dict[str, Any] = {
    "id": "c1",
    "sandbox_id": "s1",
    "pod_uid": "u1",
    "name": "app",
    "cgroups_path": "/kubepods/besteffort/podu1/c1",
    "pid": 42,
    "state": "running",
    "cpu_shares": 2,
    "cpu_quota": -1,
    "cpu_period": 100000,
    "memory_limit": 1 << 30,
}


def test_the_types_module_hands_out_the_records_module_classes() -> None:
    assert RuntimeContainer is records.RuntimeContainer
    assert RuntimeSandbox is records.RuntimeSandbox


def test_a_container_record_takes_the_dataclass_arguments_and_defaults() -> None:
    positional = RuntimeContainer(*FIELDS.values())
    by_name = RuntimeContainer(**FIELDS)
    assert positional == by_name
    assert [f.name for f in dataclasses.fields(RuntimeContainer)] == list(FIELDS)
    assert dataclasses.astuple(by_name) == tuple(FIELDS.values())
    bare = RuntimeContainer("c1", "s1", "u1", "app")
    assert (bare.cgroups_path, bare.pid, bare.state) == ("", 0, "")
    assert (bare.cpu_shares, bare.cpu_quota, bare.cpu_period, bare.memory_limit) == (0, 0, 0, 0)
    assert repr(bare).startswith("RuntimeContainer(id='c1', sandbox_id='s1'")


@pytest.mark.parametrize("name", list(FIELDS))
def test_container_records_differ_by_any_one_field_and_are_frozen(name: str) -> None:
    record = RuntimeContainer(**FIELDS)
    other_value: Any = 7 if isinstance(FIELDS[name], int) else "other"
    changed = dataclasses.replace(record, **{name: other_value})
    assert getattr(changed, name) == other_value
    assert changed != record
    assert record == RuntimeContainer(**FIELDS)
    assert hash(record) == hash(RuntimeContainer(**FIELDS))
    assert hash(record) == hash(tuple(FIELDS.values()))  # as a frozen dataclass hashes
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, name, other_value)


def test_a_container_record_is_not_equal_to_other_types() -> None:
    record = RuntimeContainer(**FIELDS)
    assert record != tuple(FIELDS.values())
    assert record != RuntimeSandbox("c1", "u1", "app", "ns")
    assert record.__eq__(object()) is NotImplemented
    assert {record: "x"}[RuntimeContainer(**FIELDS)] == "x"


def test_a_sandbox_record_takes_the_dataclass_arguments_and_defaults() -> None:
    a = RuntimeSandbox("s1", "u1", "pod", "ns")
    b = RuntimeSandbox("s1", "u1", "pod", "ns")
    assert a == b
    assert (a.labels, a.annotations, a.cgroup_parent) == ({}, {}, "")
    assert a.labels is not b.labels  # a fresh mapping each, as default_factory gave
    full = RuntimeSandbox(
        id="s1",
        uid="u1",
        name="pod",
        namespace="ns",
        labels={"a": "1"},
        annotations={"b": "2"},
        cgroup_parent="/p",
    )
    assert dataclasses.replace(a, labels={"a": "1"}, annotations={"b": "2"}, cgroup_parent="/p") == full
    assert full != a
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.name = "other"  # type: ignore[misc]
