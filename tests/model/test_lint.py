"""Lint walk over pydantic models (issue #15 item 8): typos named with the closest valid name, ranges."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from koordqos.model.lint import lint


class Leaf(BaseModel):
    enable: bool | None = None
    group_identity: int | None = Field(
        None, alias="groupIdentity", json_schema_extra={"minimum": -1, "maximum": 2}
    )


class Root(BaseModel):
    leaf: Leaf | None = None
    leaves: tuple[Leaf, ...] = ()
    free: dict[str, Any] | None = None


def test_walks_nested_models_sequences_and_names_the_closest_alias() -> None:
    doc = {
        "leaf": {"enabel": True, "groupIdentity": 1, "group_identity": 2},
        "leaves": [{"enable": True}, {"groupIdentty": 1}],
        "free": {"anything": {"goes": 1}},
        "lefa": {},
        "zzzz": 1,
    }
    found = {u.path: u.suggestion for u in lint(Root, doc)}
    assert found == {
        "leaf.enabel": "enable",
        "leaves[1].groupIdentty": "groupIdentity",
        "lefa": "leaf",
        "zzzz": None,
    }


def test_non_mappings_have_no_keys() -> None:
    assert lint(Root, ["x"]) == []
    assert lint(Root, {"leaf": "not an object"}) == []


def test_values_outside_the_advisory_range_are_findings() -> None:
    found = [
        f.describe() for f in lint(Root, {"leaf": {"groupIdentity": 3}, "leaves": [{"groupIdentity": -1}]})
    ]
    assert found == ["leaf.groupIdentity: out of range: 3 (valid: [-1, 2])"]
