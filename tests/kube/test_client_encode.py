"""encode_json: the same bytes as json.dumps, with long lists encoded in slices between yields to the loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordqos.kube import client
from koordqos.kube.client import encode_json

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=200),
        st.dictionaries(st.text(max_size=6), inner, max_size=6),
    ),
    max_leaves=400,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_the_bytes_are_json_dumps_bytes(value: Any) -> None:
    assert asyncio.run(encode_json(value)) == json.dumps(value).encode()


def test_a_nodemetric_sized_status_is_the_same_and_yields_while_encoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = [
        {"namespace": "ns", "name": f"pod-{i}", "usage": {"cpu": "1m", "memory": str(i)}} for i in range(1000)
    ]
    body = {
        "kind": "NodeMetric",
        "metadata": {"name": "n"},
        "status": {"podsMetric": pods, "updateTime": "t"},
    }
    monkeypatch.setattr(client, "SLICE_SECONDS", 0.0)  # yield after every slice
    turns = 0

    async def main() -> bytes:
        nonlocal turns
        loop = asyncio.get_running_loop()
        done = False

        def tick() -> None:
            nonlocal turns
            turns += 1
            if not done:
                loop.call_soon(tick)

        loop.call_soon(tick)
        out = await encode_json(body)
        done = True
        return out

    assert asyncio.run(main()) == json.dumps(body).encode()
    # the loop ran other callbacks while the 1,000 entries were encoded: one turn per slice of 64
    assert turns >= 1000 // client.SLICE_ITEMS
