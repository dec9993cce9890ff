"""jsontext.loads: one failure type (ValueError) for any text, also nesting deep enough for RecursionError."""

from __future__ import annotations

import json

import pytest

from koordqos.model import jsontext


def test_valid_json_is_decoded() -> None:
    assert jsontext.loads('{"a": [1, 2.5, "x", null]}') == {"a": [1, 2.5, "x", None]}


@pytest.mark.parametrize(
    "text",
    ["[" * 1200 + "]" * 1200, '{"a":' * 1200 + "1" + "}" * 1200, "[" * 100_000, "{", "", "1" * 5000],
    ids=["nested-lists", "nested-objects", "unclosed-deep", "unclosed", "empty", "huge-int"],
)
def test_any_unreadable_text_is_a_value_error(text: str) -> None:
    with pytest.raises(jsontext.JSONTextError) as info:
        jsontext.loads(text)
    assert isinstance(info.value, ValueError)


def test_the_stdlib_raises_recursion_error_for_the_nested_case() -> None:
    # the reason jsontext exists: json.loads does not fail with ValueError here
    with pytest.raises(RecursionError):
        json.loads("[" * 1200 + "]" * 1200)
